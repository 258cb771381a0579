package shared

// Review 24: adversarial checks of the takeover's repeat filter
// (buffer.UpstreamTail) on real Caddy processes, real NATS and the Go SDK
// demo upstream.

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// A takeover of a takeover: A dies, B takes the call over (its replay
// resends two before the cursor, dropped), its client reads some and goes,
// B dies too, C takes over from B's cursor (the replay resends two again,
// of events B stored): every progress notification once, in order.
func TestRepeatsTakeoverOfATakeoverDropsTheReplaysRepeats(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	d := upstreamBehind(t, resendsBefore(2))
	store := storeNATS(natsURLs(ns), "")
	a, b, c := d.start("r1", store, true), d.start("r2", store, true), d.start("r3", store, true)
	const n = 24
	ca, first := callThenKill(t, a, "2025-11-25", n, 200, 5) // priming, four progress notifications
	time.Sleep(3 * time.Second)

	second := readThenClose(t, resume(t, b, "2025-11-25", ca.SessionID, lastID(first)), 6)
	b.Kill()
	time.Sleep(3 * time.Second)
	rest := readThenClose(t, resume(t, c, "2025-11-25", ca.SessionID, lastID(second)), 0)
	wantCounted(t, "A, then B, then C", n, first, second, rest)
}

// oddIDs wraps an upstream so that its event IDs carry bytes Mcpr-Ids
// must escape or keep as they are (a comma, '%', bytes that are not
// UTF-8): the upstream's own IDs with suffix, which it strips from a
// Last-Event-ID before the upstream sees it.
func oddIDs(suffix string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if id := r.Header.Get("Last-Event-ID"); id != "" {
				r.Header.Set("Last-Event-ID", strings.TrimSuffix(id, suffix))
			}
			next.ServeHTTP(&idRewriter{ResponseWriter: w, suffix: suffix}, r)
		})
	}
}

// idRewriter appends suffix to each "id:" line the upstream writes.
type idRewriter struct {
	http.ResponseWriter
	suffix string
	pend   []byte
}

func (w *idRewriter) Write(p []byte) (int, error) {
	if !strings.HasPrefix(w.Header().Get("Content-Type"), "text/event-stream") {
		return w.ResponseWriter.Write(p)
	}
	w.pend = append(w.pend, p...)
	var out bytes.Buffer
	for {
		i := bytes.IndexByte(w.pend, '\n')
		if i < 0 {
			break
		}
		line := w.pend[:i]
		if bytes.HasPrefix(line, []byte("id:")) && len(bytes.TrimSpace(line[3:])) > 0 {
			line = append(append([]byte(nil), line...), w.suffix...)
		}
		out.Write(line)
		out.WriteByte('\n')
		w.pend = w.pend[i+1:]
	}
	if _, err := w.ResponseWriter.Write(out.Bytes()); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (w *idRewriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *idRewriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// The takeover's repeat filter with upstream IDs of odd bytes: the
// replay's repeats (eight before the cursor) of events the client acknowledged on the producer's
// replica (evicted there, kept in the record's tail, read on the replica
// that takes over) are dropped.
func TestRepeatsTakeoverDropsRepeatsOfOddIDs(t *testing.T) {
	t.Parallel()
	takeoverWithOddIDs(t, ",%2C%")
}

// The same with IDs that are not UTF-8 (a byte the proxy's parser keeps as
// it came): the events acknowledged on A come back to B's filter from the
// record's JSON with U+FFFD in place of those bytes, match nothing, and
// the replay's repeats of them reach the client twice (the natsstore
// unit: TestRepeatsTailKeepsNonUTF8IDsPastEviction).
func TestRepeatsTakeoverDropsRepeatsOfNonUTF8IDs(t *testing.T) {
	t.Parallel()
	takeoverWithOddIDs(t, "\xff\xfe")
}

func takeoverWithOddIDs(t *testing.T, suffix string) {
	ns := testnet.NATS(t)
	wrap := func(h http.Handler) http.Handler { return oddIDs(suffix)(resendsBefore(8)(h)) }
	d := upstreamBehind(t, wrap)
	store := storeNATS(natsURLs(ns), "")
	a, b := d.start("r1", store, true), d.start("r2", store, true)
	const n = 16
	// The client resumes on A first: A's eviction keeps the tail in the
	// record, which B decodes when it takes over.
	ca, first := callOn(t, a, "2025-11-25", n, 200, 5)
	second := readThenClose(t, resume(t, a, "2025-11-25", ca.SessionID, lastID(first)), 3)
	a.Kill()
	time.Sleep(3 * time.Second)
	rest := readThenClose(t, resume(t, b, "2025-11-25", ca.SessionID, lastID(second)), 0)
	p1, _, _ := callParts(t, first, second)
	p2, result, errs := callEvents(t, rest, "2")
	if len(errs) > 0 || result != fmt.Sprintf("counted to %d", n) {
		t.Fatalf("result %q, errors %q", result, errs)
	}
	if err := mcptest.OnceInOrder(append(p1, p2...), n); err != nil {
		t.Fatalf("progress before the kill %v, after the takeover %v: %v", p1, p2, err)
	}
}

// The standalone stream's producer is SIGKILLed; the next replica resumes
// the upstream from the stored cursor (TestKillOfTheStandaloneProducerRepeatsNothing),
// and this upstream's replay resends the event at the cursor and one
// before it, as the request stream's takeover above is given: every
// notice once, in order.
func TestRepeatsStandaloneMoveDropsTheReplaysRepeats(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	var seen []string
	var mu sync.Mutex
	logged := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if id := r.Header.Get("Last-Event-ID"); r.Method == http.MethodGet && id != "" {
				mu.Lock()
				seen = append(seen, id)
				mu.Unlock()
			}
			h.ServeHTTP(w, r)
		})
	}
	d := upstreamBehind(t, func(h http.Handler) http.Handler { return logged(resendsBefore(2)(h)) })
	store := storeNATS(natsURLs(ns), "")
	a, b := d.start("r1", store, true), d.start("r2", store, true)
	d.replicas = []*replica{a, b}
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		t.Logf("the upstream's GETs with Last-Event-ID: %q", seen)
		if len(seen) == 0 {
			t.Fatal("the next replica resumed the standalone stream without Last-Event-ID")
		}
	}()
	lb, err := mcptest.NewRelay(a.addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lb.Close() })
	d.lb = lb
	c := d.client("2025-11-25")
	time.Sleep(300 * time.Millisecond) // the client's standalone GET is open on A
	const n = 60
	notify(t, c, n, 50*time.Millisecond)
	mcptest.Eventually(10*time.Second, 10*time.Millisecond, func() bool { return len(c.NoticesSeen()) >= 20 })
	a.Kill()
	d.lb.SetTarget(b.addr())
	d.lb.Cut(false)
	mcptest.Eventually(30*time.Second, 50*time.Millisecond, func() bool { return len(c.NoticesSeen()) >= n })
	time.Sleep(time.Second) // anything repeated would have come by now
	got := c.NoticesSeen()
	assertNotices(t, got, n)
	if len(got) != n {
		t.Fatalf("%d notices, want %d", len(got), n)
	}
}

// A replay that resends 20 events before the cursor, more than the 16 the
// filter knows (README: "what the upstream's replay resends of the
// stream's last 16 events ... is dropped"): the older ones get through,
// at most 4 of them, nothing of the last 16, and the call ends.
func TestRepeatsReplayBeyondTheTailRepeatsOnlyWhatIsOlder(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	d := upstreamBehind(t, resendsBefore(20))
	store := storeNATS(natsURLs(ns), "")
	a, b := d.start("r1", store, true), d.start("r2", store, true)
	const n = 40
	ca, first := callThenKill(t, a, "2025-11-25", n, 100, 26) // priming, 25 progress notifications
	time.Sleep(3 * time.Second)
	rest := readThenClose(t, resume(t, b, "2025-11-25", ca.SessionID, lastID(first)), 0)
	progress, result, errs := callParts(t, first, rest)
	if len(errs) > 0 || result != fmt.Sprintf("counted to %d", n) {
		t.Fatalf("result %q, errors %q", result, errs)
	}
	seen := map[float64]int{}
	var dups []float64
	for _, p := range progress {
		if seen[p]++; seen[p] > 1 {
			dups = append(dups, p)
		}
	}
	if len(seen) != n || len(dups) > 20-buffer.TailKeep {
		t.Fatalf("%d distinct of %d, repeated %v: %v", len(seen), n, dups, progress)
	}
	t.Logf("repeated: %v", dups)
}
