package security

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// newClient returns a raw client with its own connection pool, sending
// header (credentials) with every request.
func newClient(base, version string, header http.Header) *mcptest.Client {
	c := mcptest.NewClient(base, version, &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DisableCompression: true}})
	c.Header = header
	return c
}

// mustInit opens c's session.
func mustInit(t *testing.T, c *mcptest.Client) *mcptest.Client {
	t.Helper()
	if err := c.Initialize(t.Context()); err != nil {
		t.Fatal(err)
	}
	return c
}

// background is a session that keeps a long tool call streaming, call after
// call, and checks every event it gets: proxy IDs contiguous within the
// stream, progress 1..n in order with its own token, the final result for
// its own request id, then the end of the stream. Nothing lost, nothing
// foreign.
type background struct {
	name   string
	c      *mcptest.Client
	n      int
	events atomic.Int64
	calls  atomic.Int64
	stop   chan struct{}
	done   chan struct{}

	mu   sync.Mutex
	errs []error
	last string // the last event id seen
}

// startBackground opens a session on base and starts calling `count`
// (n steps, intervalMS apart) until finish.
func startBackground(t *testing.T, base, name, version string, n, intervalMS int) *background {
	t.Helper()
	b := &background{name: name, c: mustInit(t, newClient(base, version, nil)), n: n, stop: make(chan struct{}), done: make(chan struct{})}
	go b.run(intervalMS)
	t.Cleanup(func() {
		select {
		case <-b.stop:
		default:
			close(b.stop)
		}
		<-b.done
	})
	return b
}

func (b *background) fail(err error) {
	b.mu.Lock()
	b.errs = append(b.errs, err)
	b.mu.Unlock()
}

func (b *background) run(intervalMS int) {
	defer close(b.done)
	for k := 1; ; k++ {
		select {
		case <-b.stop:
			return
		default:
		}
		if err := b.oneCall(k, intervalMS); err != nil {
			b.fail(fmt.Errorf("%s call %d: %v", b.name, k, err))
			return
		}
		b.calls.Add(1)
	}
}

func (b *background) oneCall(k, intervalMS int) error {
	token := fmt.Sprintf("%s-call-%d", b.name, k)
	reqID := 1000 + k
	// Each call runs to its end, even once the test is over: finish waits
	// for it.
	resp, err := b.c.Call(context.Background(), reqID, "count", map[string]any{"n": b.n, "interval_ms": intervalMS}, token)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var (
		prev     *eventid.ID
		progress int
		result   bool
		perr     error
	)
	err = harness.StreamEvents(resp.Body, func(ev mcptest.Event) bool {
		id, err := eventid.Parse(ev.ID)
		if err != nil {
			perr = fmt.Errorf("event without a proxy id: %+v", ev)
			return false
		}
		if prev != nil && (id.Epoch != prev.Epoch || id.Stream != prev.Stream || id.Seq != prev.Seq+1) {
			perr = fmt.Errorf("id %s after %s: not contiguous", ev.ID, prev)
			return false
		}
		prev = &id
		b.mu.Lock()
		b.last = ev.ID
		b.mu.Unlock()
		if id.Seq == 0 && ev.Data == "" && ev.Type == "" {
			return true // priming (2025-11-25)
		}
		if result {
			perr = fmt.Errorf("event after the final result: %+v", ev)
			return false
		}
		m, ok := harness.Decode(ev.Data)
		switch {
		case !ok || (ev.Type != "" && ev.Type != "message"):
			perr = fmt.Errorf("unexpected event %+v", ev)
		case m.Method == "notifications/progress":
			progress++
			if m.Params.ProgressToken != token || int(m.Params.Progress) != progress {
				perr = fmt.Errorf("progress %v (token %v) where %d (token %s) was due: lost, reordered or foreign",
					m.Params.Progress, m.Params.ProgressToken, progress, token)
			}
			b.events.Add(1)
		case m.Result != nil:
			if string(m.ID) != fmt.Sprint(reqID) || progress != b.n {
				perr = fmt.Errorf("result for id %s after %d of %d progress events", m.ID, progress, b.n)
			}
			result = true
		default:
			perr = fmt.Errorf("unexpected message %s", ev.Data)
		}
		return perr == nil
	})
	if perr != nil {
		return perr
	}
	if err != nil {
		return err
	}
	if !result {
		return fmt.Errorf("stream ended after %d of %d progress events without the result", progress, b.n)
	}
	return nil
}

// lastID is the last event ID the session saw.
func (b *background) lastID() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.last
}

// errors returns what went wrong so far.
func (b *background) errors() []error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]error(nil), b.errs...)
}

// flowing waits until at least k more events arrived, and fails the test if
// they do not or anything went wrong.
func (b *background) flowing(t *testing.T, k int64) {
	t.Helper()
	start := b.events.Load()
	deadline := time.Now().Add(20 * time.Second)
	for b.events.Load() < start+k {
		if errs := b.errors(); len(errs) > 0 {
			t.Fatalf("background session %s: %v", b.name, errors.Join(errs...))
		}
		if time.Now().After(deadline) {
			t.Fatalf("background session %s stalled: %d events in 20s", b.name, b.events.Load()-start)
		}
		time.Sleep(10 * time.Millisecond) // the poll's interval
	}
}

// finish stops after the current call (which must complete in full) and
// reports.
func (b *background) finish(t *testing.T) {
	t.Helper()
	close(b.stop)
	select {
	case <-b.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("background session %s did not finish its call", b.name)
	}
	if errs := b.errors(); len(errs) > 0 {
		t.Errorf("background session %s: %v", b.name, errors.Join(errs...))
	}
	if b.calls.Load() == 0 {
		t.Errorf("background session %s completed no call", b.name)
	}
	t.Logf("background session %s: %d calls, %d progress events, all contiguous and complete", b.name, b.calls.Load(), b.events.Load())
}

// adminSession returns the proxy's view of a session, ok false if it holds none.
func adminSession(t *testing.T, c *harness.Caddy, sid string) (buffer.SessionInfo, bool) {
	t.Helper()
	s, ok, err := mcptest.Session(c.Admin(), sid)
	if err != nil {
		t.Fatal(err)
	}
	return s, ok
}

// noLeak fails if any of the secrets appears in b.
func noLeak(t *testing.T, what string, b []byte, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if s != "" && bytes.Contains(b, []byte(s)) {
			t.Fatalf("%s leaks %q: %q", what, s, b)
		}
	}
}
