package ops

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// moduleMetrics returns the metric names resume/metrics.go defines, from
// its source: newCounterVec("x", ...), newCounter("x", ...) and desc("x", ...) calls, and
// prometheus.*Opts literals with Name: "x"; histograms come with their
// _bucket, _sum and _count series. The value is the metric's type.
func moduleMetrics(t *testing.T) map[string]string {
	t.Helper()
	path := filepath.Join(repoRoot, "resume", "metrics.go")
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	add := func(lit ast.Expr, typ string) {
		bl, ok := lit.(*ast.BasicLit)
		if !ok || bl.Kind != token.STRING {
			t.Fatalf("metrics.go: metric name is not a string literal: %#v", lit)
		}
		name, _ := strconv.Unquote(bl.Value)
		out[prefix+name] = typ
		if typ == "histogram" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				out[prefix+name+s] = "histogram"
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			if id, ok := n.Fun.(*ast.Ident); ok && len(n.Args) > 0 {
				switch id.Name {
				case "newCounterVec":
					add(n.Args[0], "countervec")
				case "newCounter":
					add(n.Args[0], "counter")
				case "desc":
					add(n.Args[0], "collected")
				}
			}
		case *ast.CompositeLit:
			sel, ok := n.Type.(*ast.SelectorExpr)
			if !ok || !strings.HasSuffix(sel.Sel.Name, "Opts") {
				return true
			}
			typ := strings.ToLower(strings.TrimSuffix(sel.Sel.Name, "Opts"))
			for _, el := range n.Elts {
				if kv, ok := el.(*ast.KeyValueExpr); ok {
					// Name: name inside newCounterVec is covered by its callers.
					if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "Name" {
						if _, param := kv.Value.(*ast.Ident); !param {
							add(kv.Value, typ)
						}
					}
				}
			}
		}
		return true
	})
	if len(out) < 10 {
		t.Fatalf("found only %d metrics in metrics.go: %v", len(out), out)
	}
	return out
}

var metricRef = regexp.MustCompile(`\b[a-z_]*mcp_resume_[a-z_]+\b`)

// checkExpr checks that a PromQL expression names only metrics metrics.go
// defines, and at least one.
func checkExpr(t *testing.T, where, expr string, known map[string]string, used map[string]bool) {
	t.Helper()
	refs := metricRef.FindAllString(expr, -1)
	if len(refs) == 0 {
		t.Errorf("%s: expression names no caddy_mcp_resume_ metric: %s", where, expr)
	}
	for _, r := range refs {
		if _, ok := known[r]; !ok {
			t.Errorf("%s: %s is not a metric of resume/metrics.go (expr %s)", where, r, expr)
		}
		used[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(r, "_bucket"), "_sum"), "_count")] = true
	}
	if strings.Count(expr, "(") != strings.Count(expr, ")") || strings.Count(expr, "[") != strings.Count(expr, "]") ||
		strings.Count(expr, "{") != strings.Count(expr, "}") {
		t.Errorf("%s: unbalanced brackets: %s", where, expr)
	}
	// Aggregations keep only labels the metrics have (or Prometheus adds).
	for _, m := range regexp.MustCompile(`\bby \(([^)]*)\)`).FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(m[1], ",") {
			switch strings.TrimSpace(l) {
			case "instance", "job", "le", "outcome", "reason", "limit", "zone", "op", "writer":
			default:
				t.Errorf("%s: aggregation by unknown label %q: %s", where, l, expr)
			}
		}
	}
}

type dashboard struct {
	UID           string `json:"uid"`
	Title         string `json:"title"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID         int                      `json:"id"`
	Type       string                   `json:"type"`
	Title      string                   `json:"title"`
	Datasource map[string]string        `json:"datasource"`
	GridPos    struct{ H, W, X, Y int } `json:"gridPos"`
	Targets    []struct {
		Expr       string            `json:"expr"`
		RefID      string            `json:"refId"`
		Datasource map[string]string `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

// The Grafana dashboard parses, uses a Prometheus data source variable, and
// every query names metrics that exist; every metric has a panel.
func TestGrafanaDashboard(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot, "grafana", "mcp-resume-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 36 {
		t.Errorf("dashboard uid %q, title %q, schemaVersion %d", d.UID, d.Title, d.SchemaVersion)
	}
	hasDS := false
	for _, v := range d.Templating.List {
		if v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus" {
			hasDS = true
		}
	}
	if !hasDS {
		t.Error("no Prometheus data source variable named datasource")
	}

	known := moduleMetrics(t)
	used := map[string]bool{}
	ids := map[int]bool{}
	var all []panel
	for _, p := range d.Panels {
		all = append(all, p)
		all = append(all, p.Panels...)
	}
	bigStat := false
	for _, p := range all {
		if ids[p.ID] {
			t.Errorf("duplicate panel id %d", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: gridPos %+v", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource["uid"] != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: datasource %v, %d targets", p.Title, p.Datasource, len(p.Targets))
		}
		for _, tg := range p.Targets {
			if tg.Datasource["uid"] != "${datasource}" || tg.RefID == "" {
				t.Errorf("panel %q: target datasource %v refId %q", p.Title, tg.Datasource, tg.RefID)
			}
			checkExpr(t, "panel "+strconv.Quote(p.Title), tg.Expr, known, used)
			if p.Type == "stat" && p.GridPos.W >= 6 && strings.Contains(tg.Expr, "events_evicted_before_ack_total") {
				bigStat = true
			}
		}
	}
	if !bigStat {
		t.Error("no big stat panel on caddy_mcp_resume_events_evicted_before_ack_total")
	}
	var missing []string
	for name, typ := range known {
		if typ == "histogram" && (strings.HasSuffix(name, "_sum") || strings.HasSuffix(name, "_count") || strings.HasSuffix(name, "_bucket")) {
			continue
		}
		if !used[name] {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("metrics without a panel: %v", missing)
	}
}

// The alert rules name existing metrics, and one fires on any increase of
// events evicted before their ack.
func TestAlertRules(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot, "grafana", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	known := moduleMetrics(t)
	used := map[string]bool{}
	var alert string
	found := false
	rules := 0
	for i, line := range strings.Split(string(raw), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.Contains(line, "\t") {
			t.Errorf("alerts.yml:%d: tab in YAML", i+1)
		}
		if v, ok := strings.CutPrefix(trimmed, "- alert:"); ok {
			alert = strings.TrimSpace(v)
			rules++
		}
		if v, ok := strings.CutPrefix(trimmed, "expr:"); ok {
			expr := strings.TrimSpace(v)
			if alert == "" {
				t.Errorf("alerts.yml:%d: expr outside an alert rule", i+1)
			}
			checkExpr(t, "alert "+alert, expr, known, used)
			if expr == "increase(caddy_mcp_resume_events_evicted_before_ack_total[5m]) > 0" {
				found = true
			}
			alert = ""
		}
	}
	if !strings.HasPrefix(strings.TrimSpace(stripComments(string(raw))), "groups:") || rules == 0 {
		t.Errorf("alerts.yml is not a Prometheus rule file with groups of alert rules")
	}
	if !found {
		t.Error("no alert rule with expr: increase(caddy_mcp_resume_events_evicted_before_ack_total[5m]) > 0")
	}
}

func stripComments(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// logCall matches a zap call with a literal message: logger.Info("msg", or
// logger.Check(zap.DebugLevel, "msg").
var logCall = regexp.MustCompile(`\.(?:Debug|Info|Warn|Error)\(\s*"([^"]+)"|\.Check\(zap\.\w+,\s*"([^"]+)"`)

// README.md covers every metric metrics.go defines and every log
// message the engine (resume) and the Caddy module write.
func TestOperationsDocIsComplete(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for name, typ := range moduleMetrics(t) {
		if typ == "histogram" && (strings.HasSuffix(name, "_sum") || strings.HasSuffix(name, "_count") || strings.HasSuffix(name, "_bucket")) {
			continue
		}
		if !strings.Contains(string(doc), "`"+name+"`") {
			t.Errorf("README.md does not describe metric %s", name)
		}
	}
	var files []string
	for _, dir := range []string{"resume", "caddymodule", filepath.Join("caddymodule", "storenats")} {
		fs, err := filepath.Glob(filepath.Join(repoRoot, dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, fs...)
	}
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range logCall.FindAllStringSubmatch(string(src), -1) {
			msg := m[1] + m[2]
			n++
			if !strings.Contains(string(doc), "`"+msg+"`") {
				t.Errorf("README.md does not list the log message %q (%s)", msg, filepath.Base(f))
			}
		}
	}
	if n < 10 {
		t.Errorf("found only %d log calls in resume and caddymodule", n)
	}
}
