package ops

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// logTo is a global option: the module's logs, INFO and up, as JSON to a file.
func logTo(path string) string {
	return fmt.Sprintf(`	log mcp {
		output file %s
		format json
		level INFO
		include http.handlers.mcp_resume
	}`, path)
}

type logLine struct {
	Level   string `json:"level"`
	Logger  string `json:"logger"`
	Msg     string `json:"msg"`
	Session string `json:"session"`
	Reason  string `json:"reason"`
}

// findLog waits for a line with msg about session in a JSON log file.
func findLog(t *testing.T, path, msg, session string) (logLine, bool) {
	t.Helper()
	var found logLine
	ok := mcptest.Eventually(3*time.Second, 20*time.Millisecond, func() bool {
		b, err := os.ReadFile(path)
		if err != nil {
			return false
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			var l logLine
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == msg && l.Session == session {
				found = l
				return true
			}
		}
		return false
	})
	return found, ok
}

// The module's log lines go where the current config says, after a reload
// too: those the request handlers write and those the retention store writes
// on its own (a session ended, a stream failed, a stall, the BUG line).
func TestLogsFollowReload(t *testing.T) {
	upstream := harness.StartDemo(t, demoserver.Options{})
	dir := t.TempDir()
	first, second := filepath.Join(dir, "first.log"), filepath.Join(dir, "second.log")

	// No mcp_resume yet: the module's store is created by the next config.
	c := harness.StartCaddy(t, "\trespond 204")
	for i, path := range []string{first, second} {
		c.LoadWithGlobal(t, logTo(path), site(upstream, ""))
		cl := harness.NewSession(t, c.Base(), "2025-11-25")
		l, ok := findLog(t, path, "session registered", cl.SessionID)
		if !ok || l.Level != "info" || l.Logger != "http.handlers.mcp_resume" {
			t.Fatalf("config %d: no 'session registered' line for %s in %s (got %+v)", i+1, cl.SessionID, path, l)
		}
		if status, raw := adminDo(t, c, "DELETE", "/mcp_resume/sessions/"+cl.SessionID); status != http.StatusNoContent {
			t.Fatalf("purge: %d %s", status, raw)
		}
		if l, ok := findLog(t, path, "session ended", cl.SessionID); !ok || l.Reason != "purged" {
			_, stale := findLog(t, first, "session ended", cl.SessionID)
			t.Errorf("config %d: no 'session ended' line (reason purged) for %s in %s, the log of the current config (in %s, the first config's log: %v)",
				i+1, cl.SessionID, filepath.Base(path), filepath.Base(first), stale)
		}
	}
}
