package shared

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// blipRelay (review 45) is a TCP relay to NATS that can delay every byte
// by a fixed time in each direction (order kept) and blip: cut every
// connection and refuse new ones for a while.
type blipRelay struct {
	ln     net.Listener
	target string
	delay  atomic.Int64 // ns, each direction
	down   atomic.Bool
	mu     sync.Mutex
	conns  map[net.Conn]bool
}

func newBlipRelay(t *testing.T, target string) *blipRelay {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &blipRelay{ln: ln, target: target, conns: map[net.Conn]bool{}}
	go r.serve()
	t.Cleanup(func() { ln.Close(); r.cut() })
	return r
}

func (r *blipRelay) addr() string { return r.ln.Addr().String() }

func (r *blipRelay) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		if r.down.Load() {
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", r.target)
		if err != nil {
			c.Close()
			continue
		}
		r.mu.Lock()
		r.conns[c], r.conns[up] = true, true
		r.mu.Unlock()
		go r.pipe(up, c)
		go r.pipe(c, up)
	}
}

// pipe copies src to dst, each chunk sent delay after it was read.
func (r *blipRelay) pipe(dst, src net.Conn) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	ch := make(chan chunk, 4096)
	go func() {
		defer close(ch)
		for {
			buf := make([]byte, 32*1024)
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{buf[:n], time.Now().Add(time.Duration(r.delay.Load()))}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		if d := time.Until(c.at); d > 0 {
			time.Sleep(d)
		}
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
	r.mu.Lock()
	delete(r.conns, dst)
	delete(r.conns, src)
	r.mu.Unlock()
}

func (r *blipRelay) cut() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.conns)
	for c := range r.conns {
		c.Close()
		delete(r.conns, c)
	}
	return n
}

// blip cuts every connection and refuses new ones for d.
func (r *blipRelay) blip(d time.Duration) {
	r.down.Store(true)
	r.cut()
	time.Sleep(d)
	r.down.Store(false)
}

// blipCall is what one client of a call saw.
type blipCall struct {
	id       int
	sid      string
	parts    [][]mcptest.Event
	refusals []string // non-200 answers (explicit), with when
	fail     string   // what went wrong beyond an explicit answer
}

// runBlipCall opens a session on first, calls count (n progress, every
// intervalMS), reads k events and goes away for away; then resumes (from
// the last event ID it has) on each of resumeOn in turn until the call's
// result or error came, as a client would; a refused GET is tried again
// after 500 ms, for up to 30 s.
func runBlipCall(id int, first string, resumeOn []string, n, intervalMS, k int, away time.Duration) *blipCall {
	bc := &blipCall{id: id}
	hc := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	c := mcptest.NewClient("http://"+first, "2025-11-25", hc)
	ctx := context.Background()
	start := time.Now()
	if err := c.Initialize(ctx); err != nil {
		bc.refusals = append(bc.refusals, fmt.Sprintf("initialize: %v", err))
		return bc
	}
	bc.sid = c.SessionID
	resp, err := c.Call(ctx, 2, "count", map[string]any{"n": n, "interval_ms": intervalMS}, "tok")
	if err != nil {
		bc.refusals = append(bc.refusals, fmt.Sprintf("call: %v", err))
		return bc
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		bc.refusals = append(bc.refusals, fmt.Sprintf("call at %v: %d %s", time.Since(start).Round(time.Millisecond), resp.StatusCode, strings.TrimSpace(string(b))))
		return bc
	}
	evs, err := mcptest.ReadEvents(resp.Body, k, 20*time.Second)
	resp.Body.Close()
	bc.parts = append(bc.parts, evs)
	if err != nil {
		bc.fail = fmt.Sprintf("first read at %v: %v (got %d events)", time.Since(start).Round(time.Millisecond), err, len(evs))
		return bc
	}
	time.Sleep(away)
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		if done, _ := blipEnded(bc.parts); done {
			return bc
		}
		last := ""
		for _, p := range bc.parts {
			for _, ev := range p {
				if ev.ID != "" {
					last = ev.ID
				}
			}
		}
		c.URL = "http://" + resumeOn[i%len(resumeOn)] + "/mcp"
		resp, err := c.Resume(ctx, last)
		if err != nil {
			bc.refusals = append(bc.refusals, fmt.Sprintf("GET at %v: %v", time.Since(start).Round(time.Millisecond), err))
			time.Sleep(500 * time.Millisecond)
			continue
		}
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			bc.refusals = append(bc.refusals, fmt.Sprintf("GET on %s at %v: %d %s", resumeOn[i%len(resumeOn)], time.Since(start).Round(time.Millisecond), resp.StatusCode, strings.TrimSpace(string(b))))
			time.Sleep(500 * time.Millisecond)
			continue
		}
		evs, err := mcptest.ReadEvents(resp.Body, 0, 20*time.Second)
		resp.Body.Close()
		bc.parts = append(bc.parts, evs)
		if err != nil && !strings.Contains(err.Error(), "EOF") {
			// 20 s with the stream open and nothing ending it: silence.
			if done, _ := blipEnded(bc.parts); !done {
				bc.fail = fmt.Sprintf("GET on %s at %v from %q: %v (got %d events)", resumeOn[i%len(resumeOn)], time.Since(start).Round(time.Millisecond), last, err, len(evs))
				return bc
			}
		}
	}
	if done, _ := blipEnded(bc.parts); !done {
		bc.fail = "no result nor error after 60 s of resuming"
	}
	return bc
}

// blipEnded reports whether request 2's answer (result or error) came.
func blipEnded(parts [][]mcptest.Event) (bool, bool) {
	for _, p := range parts {
		for _, ev := range p {
			if ev.Data == "" {
				continue
			}
			m, err := mcptest.DecodeMessage(ev.Data)
			if err == nil && string(m.ID) == "2" {
				return true, m.Error != nil
			}
		}
	}
	return false, false
}

// verdict checks a call: every progress notification once, in order, and
// one answer; an explicit error answer (or refusal) is reported apart.
func (bc *blipCall) verdict(n int) (fault, explicit string) {
	if bc.fail != "" {
		return bc.fail, ""
	}
	var progress []float64
	answers, results := 0, ""
	var errs, gaps []string
	for _, p := range bc.parts {
		for _, ev := range p {
			if ev.Type == "gap" {
				gaps = append(gaps, ev.Data)
				continue
			}
			if ev.Data == "" {
				continue
			}
			m, err := mcptest.DecodeMessage(ev.Data)
			if err != nil {
				return fmt.Sprintf("event %s: %v", ev.ID, err), ""
			}
			switch {
			case m.Method == "notifications/progress":
				progress = append(progress, m.Params.Progress)
			case string(m.ID) == "2":
				answers++
				if m.Error != nil {
					errs = append(errs, m.Error.Message)
				} else {
					var r struct {
						Content []struct{ Text string } `json:"content"`
					}
					json.Unmarshal(m.Result, &r)
					for _, c := range r.Content {
						results += c.Text
					}
				}
			}
		}
	}
	if len(bc.parts) == 0 {
		return "", strings.Join(bc.refusals, "; ")
	}
	if answers > 1 {
		return fmt.Sprintf("answered %d times (results %q errors %q)", answers, results, errs), ""
	}
	if len(errs) > 0 || len(gaps) > 0 {
		// Explicit, but progress must still not repeat.
		seen := map[float64]bool{}
		for _, p := range progress {
			if seen[p] {
				return fmt.Sprintf("progress %v repeated before error %q (all %v)", p, errs, progress), ""
			}
			seen[p] = true
		}
		return "", fmt.Sprintf("errors %q gaps %q after %d progress and %d results (%q)", errs, gaps, len(progress), answers-len(errs), results)
	}
	if answers == 0 {
		return fmt.Sprintf("no answer; %d progress; refusals %q", len(progress), bc.refusals), ""
	}
	if results != fmt.Sprintf("counted to %d", n) {
		return fmt.Sprintf("result %q", results), ""
	}
	if err := mcptest.OnceInOrder(progress, n); err != nil {
		return err.Error(), ""
	}
	return "", ""
}

// Review 45 (mended; older than this work): one call on A, upstream without event IDs (no takeover can
// resume it), A healthy and its upstream too; the call's client reads
// three events (the priming event and progress 1..2) and goes away. A's
// NATS connection blips (cut 1 s, well within lease_ttl 2s) while the
// call runs; the client comes back on B with Last-Event-ID ...-2 just
// before the blip ends. B's resume acknowledges 1..2 and purges them; A,
// back, finds the stream's subject empty and takes it for another writer
// (natsstore: TestReview45WriterSurvivesABlipWithAReaderOnB): A logs
// "BUG: event evicted while a client could still ask for it", aborts the
// upstream response, and the client gets, after takeover_wait, the call
// failed (upstream_failed) after progress 2 of 15. The same blip with the
// client resuming on A, or earlier, is harmless. A's writer now reads the
// record's floor from KV when its mirror has not seen it move.
func TestNATSBlipWhileTheClientResumesElsewhere(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		blipAt time.Duration // after the session's creation
	}{{"blip at 0.8s", 800 * time.Millisecond}, {"blip at 0.9s", 900 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ns := testnet.NATS(t)
			relay := newBlipRelay(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
			d := &deployment{t: t, upstream: harness.StartDemo(t, demoserver.Options{})}
			a := d.start("r1", storeNATS([]string{"nats://" + relay.addr()}, "takeover_wait 5s"), true)
			b := d.start("r2", storeNATS(natsURLs(ns), "takeover_wait 5s"), true)
			const n = 15
			go func() {
				time.Sleep(tc.blipAt)
				relay.blip(time.Second)
			}()
			bc := runBlipCall(0, a.addr(), []string{b.addr(), a.addr()}, n, 300, 3, 1200*time.Millisecond)
			fault, explicit := bc.verdict(n)
			bug := strings.Contains(a.Logs(), "BUG: event evicted")
			if fault != "" || explicit != "" || bug {
				for _, r := range []*replica{a, b} {
					for _, l := range strings.Split(r.Logs(), "\n") {
						if strings.Contains(l, "mcp_resume") && !strings.Contains(l, "request refused") {
							t.Logf("%s: %s", r.name, l)
						}
					}
				}
				t.Fatalf("FAULT: a 1 s NATS blip on A, the call's client back on B during it: %s%s (A logged an eviction BUG: %v)", fault, explicit, bug)
			}
		})
	}
}

// Review 45: A's NATS is slow (each direction delayed 300 ms), no blip;
// four calls on A, 0.7 s apart, their clients away after three events and
// back 1.2 s later on A or B. Each must count, or be refused at its start;
// a call that ran must not be failed. Seen with lease_ttl 2s (also before
// this work): a call whose client had every progress notification and the
// result was then failed by B's sweeper (upstream_failed): A's renewals,
// one after another and each a 600 ms round trip, let its leases lapse.
// A renewal's bound is a sixth of lease_ttl (README), so the test runs at
// 6 s; the renewals now go 16 at a time, each round from its start.
func TestNATSSlowWhileCallsRun(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	relay := newBlipRelay(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	d := &deployment{t: t, upstream: harness.StartDemo(t, demoserver.Options{})}
	// A lease_ttl whose sixth (a renewal's bound) outlasts the round trip,
	// as the README asks of a slow NATS: 2 s would not.
	slowStore := func(urls []string) string {
		return strings.Replace(storeNATS(urls, "takeover_wait 5s"), "lease_ttl 2s", "lease_ttl 6s", 1)
	}
	a := d.start("r1", slowStore([]string{"nats://" + relay.addr()}), true)
	b := d.start("r2", slowStore(natsURLs(ns)), true)
	relay.delay.Store(int64(300 * time.Millisecond))
	const n = 15
	var wg sync.WaitGroup
	calls := make([]*blipCall, 4)
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * 700 * time.Millisecond)
			on := []string{a.addr(), b.addr()}
			if i%2 == 1 {
				on = []string{b.addr(), a.addr()}
			}
			calls[i] = runBlipCall(i, a.addr(), on, n, 300, 3, 1200*time.Millisecond)
		}()
	}
	wg.Wait()
	for _, bc := range calls {
		fault, explicit := bc.verdict(n)
		switch {
		case fault != "":
			t.Errorf("FAULT: call %d on a slow NATS: %s", bc.id, fault)
		case explicit != "" && len(bc.parts) > 0:
			t.Errorf("FAULT: call %d on a slow NATS ran and then failed: %s", bc.id, explicit)
			for i, p := range bc.parts {
				for _, ev := range p {
					t.Logf("call %d part %d: id %q type %q data %.120s", bc.id, i, ev.ID, ev.Type, ev.Data)
				}
			}
		case explicit != "":
			t.Logf("call %d refused: %s", bc.id, explicit)
		default:
			t.Logf("call %d counted", bc.id)
		}
	}
	if t.Failed() {
		for _, r := range []*replica{a, b} {
			for _, l := range strings.Split(r.Logs(), "\n") {
				if strings.Contains(l, "mcp_resume") && !strings.Contains(l, "request refused") {
					t.Logf("%s: %s", r.name, l)
				}
			}
		}
	}
}
