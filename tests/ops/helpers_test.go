package ops

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

const prefix = "caddy_mcp_resume_"

// site is the typical use, plus Caddy's `metrics` handler at /metrics so the
// same registry can be scraped from the site as well as from the admin API.
func site(upstream, moduleOptions string) string {
	return "\tmetrics /metrics\n" + mcptest.ResumeRoute(upstream, moduleOptions)
}

// start runs the demo server and a Caddy in front of it.
func start(t *testing.T, moduleOptions string) (*harness.Caddy, string) {
	t.Helper()
	upstream := harness.StartDemo(t, demoserver.Options{})
	return harness.StartCaddy(t, site(upstream, moduleOptions)), upstream
}

// ---- metrics ---------------------------------------------------------------

// sample is one scrape, with lookups by the module's metric names.
type sample struct{ mcptest.Metrics }

// scrape reads a Prometheus text-format endpoint.
func scrape(t *testing.T, url string) sample {
	t.Helper()
	m, err := mcptest.ScrapeMetrics(url)
	if err != nil {
		t.Fatal(err)
	}
	return sample{m}
}

// scrapeBoth scrapes the admin endpoint's /metrics, then the site's metrics
// handler. They serve the same registry: the site must show every
// caddy_mcp_resume_ series the admin endpoint showed, with counters no lower
// (gauges may move between the two scrapes, e.g. as a client disconnects).
func scrapeBoth(t *testing.T, c *harness.Caddy) sample {
	t.Helper()
	admin := scrape(t, c.Admin()+"/metrics")
	fromSite := scrape(t, c.Base()+"/metrics")
	for k, v := range admin.family(prefix).Series {
		w, ok := fromSite.Series[k]
		if !ok || (!admin.isGauge(k) && w < v) {
			t.Errorf("admin /metrics has %s %v, the site's metrics handler %v (present %v)", k, v, w, ok)
		}
	}
	if len(admin.family(prefix).Series) == 0 {
		t.Fatalf("admin /metrics has no %s* metrics", prefix)
	}
	return admin
}

// get returns a value; an absent series counts as 0 (a CounterVec exports a
// label value only once it moved).
func (m sample) get(name string, labels ...string) float64 {
	return m.Series[key(name, labels...)]
}

// lookup returns a value and whether the series is present.
func (m sample) lookup(name string, labels ...string) (float64, bool) {
	v, ok := m.Series[key(name, labels...)]
	return v, ok
}

// isGauge reports whether a series belongs to a gauge family.
func (m sample) isGauge(series string) bool {
	name, _, _ := strings.Cut(series, "{")
	return m.Types[name] == "gauge"
}

func key(name string, labels ...string) string {
	k := prefix + name
	if len(labels) > 0 {
		var b strings.Builder
		for i := 0; i < len(labels); i += 2 {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%s=%q", labels[i], labels[i+1])
		}
		k += "{" + b.String() + "}"
	}
	return k
}

// family returns the series whose name starts with p.
func (m sample) family(p string) sample {
	out := sample{mcptest.Metrics{Series: map[string]float64{}, Types: m.Types}}
	for k, v := range m.Series {
		if strings.HasPrefix(k, p) {
			out.Series[k] = v
		}
	}
	return out
}

// expectDelta checks that a series moved by exactly want between two scrapes.
func expectDelta(t *testing.T, before, after sample, want float64, name string, labels ...string) {
	t.Helper()
	if got := after.get(name, labels...) - before.get(name, labels...); got != want {
		t.Errorf("%s moved by %v, want %v (before %v, after %v)", key(name, labels...), got, want,
			before.get(name, labels...), after.get(name, labels...))
	}
}

// ---- event IDs ------------------------------------------------------------------

// ids returns the events' IDs.
func ids(evs []mcptest.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.ID
	}
	return out
}

// wantIDs checks event IDs <epoch>-<stream>-<seq> for the given seqs.
func wantIDs(t *testing.T, evs []mcptest.Event, epoch string, stream uint32, seqs ...uint64) {
	t.Helper()
	want := make([]string, len(seqs))
	for i, s := range seqs {
		want[i] = eventid.ID{Epoch: epoch, Stream: stream, Seq: s}.String()
	}
	if got := ids(evs); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("event ids %v, want %v (events %+v)", got, want, evs)
	}
}

// epochOf returns the epoch of a proxy-minted event ID.
func epochOf(t *testing.T, id string) string {
	t.Helper()
	p, err := eventid.Parse(id)
	if err != nil {
		t.Fatalf("event id %q: %v", id, err)
	}
	return p.Epoch
}

// ---- admin API -----------------------------------------------------------------

// adminDo sends a request to Caddy's admin endpoint and returns status and body.
func adminDo(t *testing.T, c *harness.Caddy, method, path string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, c.Admin()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := mcptest.AdminClient.Do(req)
	if err != nil {
		t.Fatalf("admin %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// sessionInfo mirrors the admin API's JSON (buffer.SessionInfo); decoding is
// strict so a renamed or added field shows up here and in README.md.
type sessionInfo struct {
	Zone             string       `json:"zone"`
	ID               string       `json:"id"`
	Epoch            string       `json:"epoch"`
	ProtocolVersion  string       `json:"protocol_version"`
	Origin           string       `json:"origin"`
	Created          time.Time    `json:"created"`
	LastActivity     time.Time    `json:"last_activity"`
	ConnectedClients int          `json:"connected_clients"`
	RetainedBytes    int64        `json:"retained_bytes"`
	Streams          []streamInfo `json:"streams"`
}

type streamInfo struct {
	Stream        uint32   `json:"stream"`
	Kind          string   `json:"kind"`
	State         string   `json:"state"`
	FailReason    string   `json:"fail_reason"`
	Floor         uint64   `json:"floor"`
	Head          uint64   `json:"head"`
	Acked         uint64   `json:"acked"`
	RetainedBytes int64    `json:"retained_bytes"`
	Connected     bool     `json:"connected"`
	Producing     bool     `json:"producing"`
	Stalled       bool     `json:"stalled"`
	Stalls        uint64   `json:"stalls"`
	RequestIDs    []string `json:"request_ids"`
}

func decodeStrict(t *testing.T, b []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decoding admin output: %v\n%s", err, b)
	}
}

func adminSessions(t *testing.T, c *harness.Caddy) []sessionInfo {
	t.Helper()
	status, b := adminDo(t, c, "GET", "/mcp_resume/sessions")
	if status != http.StatusOK {
		t.Fatalf("GET /mcp_resume/sessions: %d %s", status, b)
	}
	var out []sessionInfo
	decodeStrict(t, b, &out)
	return out
}

func (s sessionInfo) stream(t *testing.T, num uint32) streamInfo {
	t.Helper()
	for _, st := range s.Streams {
		if st.Stream == num {
			return st
		}
	}
	t.Fatalf("session %s has no stream %d: %+v", s.ID, num, s.Streams)
	return streamInfo{}
}
