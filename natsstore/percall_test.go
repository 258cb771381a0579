package natsstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// What one short call costs the store in NATS operations: a tools/call
// answered by one progress notification and the result, relayed to its
// client as the glue does, then left to the sweeper (eviction after the
// window, retirement of the ended stream). Counted on the wire, by a
// connection that sees every message on the embedded server: KV writes
// by bucket, event publishes, consumer creates and deletes, direct gets,
// purges, pull requests. The bounds keep per-call work from creeping back
// (issue 23); raise one only with a reason a guarantee needs.

// wiretap counts the messages the store sends, by what they are.
type wiretap struct {
	nc     *nats.Conn
	mu     sync.Mutex
	counts map[string]int
	prefix string
}

func newWiretap(t testing.TB, st *Store) *wiretap {
	t.Helper()
	nc, err := nats.Connect("", nats.InProcessServer(st.srv))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	w := &wiretap{nc: nc, counts: make(map[string]int), prefix: st.opts.Prefix}
	if _, err := nc.Subscribe(">", func(m *nats.Msg) { w.take(m.Subject, m.Reply) }); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return w
}

// kind names what a message on subject is, "" for what no call causes:
// replies, advisories, the health probe and the sweeper's lease.
func (w *wiretap) kind(subject string) string {
	p := w.prefix
	switch {
	case strings.HasPrefix(subject, "_INBOX."), strings.HasPrefix(subject, "$JS.EVENT."), strings.Contains(subject, "_probe"),
		strings.HasPrefix(subject, "$KV."+p+"_META."), strings.Contains(subject, "KV_"+p+"_META"):
		return ""
	case strings.HasPrefix(subject, "$KV."):
		bucket, _, _ := strings.Cut(strings.TrimPrefix(subject, "$KV."+p+"_"), ".")
		return "kv write " + strings.ToLower(bucket)
	case strings.HasPrefix(subject, p+".ev."):
		return "event publish"
	case strings.HasPrefix(subject, p+".n."):
		// A write's notification to the replicas that serve its session
		// (interest.go): core NATS, nothing stored or acknowledged.
		return "notification"
	case strings.HasPrefix(subject, "$JS.API.DIRECT.GET."):
		return "direct get"
	case strings.HasPrefix(subject, "$JS.API.CONSUMER.CREATE."), strings.HasPrefix(subject, "$JS.API.CONSUMER.DURABLE.CREATE."),
		strings.HasPrefix(subject, "$JS.API.CONSUMER.DELETE."):
		// A KV stream's consumer is a watch's: one made again is the
		// watch resuming after a missed heartbeat (a loaded machine), what
		// no call causes; a reader's is on the events stream.
		op := "create"
		if strings.HasPrefix(subject, "$JS.API.CONSUMER.DELETE.") {
			op = "delete"
		}
		if stream := strings.Split(subject, ".")[4]; strings.HasPrefix(stream, "KV_") {
			return "watch consumer " + op
		}
		return "consumer " + op
	case strings.HasPrefix(subject, "$JS.API.CONSUMER.MSG.NEXT."):
		return "pull request"
	case strings.HasPrefix(subject, "$JS.API.STREAM.PURGE."):
		return "purge"
	case strings.HasPrefix(subject, "$JS.API.STREAM.MSG.GET."):
		return "msg get"
	case strings.HasPrefix(subject, "$JS.API.STREAM.INFO."):
		return "stream info"
	case strings.HasPrefix(subject, "$JS.API."):
		return "api " + strings.Join(strings.Split(subject, ".")[2:4], ".")
	case strings.HasPrefix(subject, "$JS.ACK."):
		return "ack"
	case strings.HasPrefix(subject, "$JS.FC."):
		return "flow control"
	}
	return "other " + subject
}

func (w *wiretap) take(subject, reply string) {
	k := w.kind(subject)
	if strings.HasPrefix(reply, "$JS.ACK.") {
		k = "delivery" // a consumer's (a watch's, a reader's) copy of a stored message
	}
	if k == "" {
		return
	}
	w.mu.Lock()
	w.counts[k]++
	w.mu.Unlock()
}

// since returns the counts since the last call (and starts again), once
// what the server routed before has reached the tap.
func (w *wiretap) since() map[string]int {
	w.nc.Flush()
	time.Sleep(20 * time.Millisecond)
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.counts
	w.counts = make(map[string]int)
	return c
}

func total(c map[string]int, match func(string) bool) int {
	n := 0
	for k, v := range c {
		if match(k) {
			n += v
		}
	}
	return n
}

func describe(c map[string]int, calls int) string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %-22s %5.2f per call", k, float64(c[k])/float64(calls))
	}
	return b.String()
}

// shortCall runs one call on sess as the glue does: the stream opened, its
// producer role taken and its client attached (OpenCall), relayed (read, written,
// delivered) to the end, a progress event and the result appended, the
// stream completed and the role given up.
func shortCall(t testing.TB, sess buffer.Session, id string) {
	t.Helper()
	var key [32]byte
	copy(key[:], id)
	str, p, rd, err := sess.(buffer.CallOpener).OpenCall(context.Background(), []string{id}, key)
	if err != nil {
		t.Fatal(err)
	}
	relayed := make(chan error, 1)
	go func() {
		defer rd.Close()
		dst := make([][]byte, 0, 8)
		for {
			b, err := rd.Read(context.Background(), dst, 256<<10, 5*time.Second)
			if len(b.Data) > 0 {
				rd.Delivered(b.Last)
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				relayed <- err
				return
			}
		}
	}()
	progress := []byte(`data: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}` + "\n")
	result := []byte(`data: {"jsonrpc":"2.0","id":` + id + `,"result":{"content":[{"type":"text","text":"ok"}]}}` + "\n")
	if _, err := str.Append(context.Background(), buffer.Entry{Fields: progress}); err != nil {
		t.Fatal(err)
	}
	if _, err := str.Append(context.Background(), buffer.Entry{Fields: result, Answers: []string{id}}); err != nil {
		t.Fatal(err)
	}
	str.Complete()
	p.Done()
	select {
	case err := <-relayed:
		if err != nil {
			t.Fatalf("relay of call %s: %v", id, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("call %s never ended for its client", id)
	}
	if v := str.View(); v.State != policy.Complete || v.Head != 2 {
		t.Fatalf("call %s: %+v", id, v)
	}
}

// perCallBound is what one call may cost, at most, in each kind of
// operation (averaged over the calls of the test), and in all of them.
type perCallBound struct {
	kind  string
	match func(string) bool
	max   float64
}

func is(k string) func(string) bool { return func(s string) bool { return s == k } }
func prefixed(p string) func(string) bool {
	return func(s string) bool { return strings.HasPrefix(s, p) }
}

func TestWhatAShortCallCosts(t *testing.T) {
	old := tidyAge
	tidyAge = 200 * time.Millisecond // the delete markers' purges count too
	t.Cleanup(func() { tidyAge = old })
	lim := testLimits()
	// A window long enough that no call lasts a delivery quantum (window/64)
	// even under the race detector: a longer call writes its deliveries
	// once more on the way, as it should.
	lim.ResumeWindow = 2 * time.Second
	lim.SessionIdleTimeout = time.Hour
	st := openEmbedded(t, lim, func(o *Options) {
		o.SweepInterval = 50 * time.Millisecond
		o.LeaseTTL = time.Minute // no renewals within the test
	})
	tap := newWiretap(t, st)
	sess, err := st.CreateSession("percall", buffer.SessionMeta{Version: "2025-06-18"})
	if err != nil {
		t.Fatal(err)
	}
	// Enough calls before that the session keeps as many ended streams as
	// it may: each call measured then retires one.
	for i := 0; i < buffer.EndedStreamsKept; i++ {
		shortCall(t, sess, fmt.Sprint(1000+i))
	}
	settled := func(what string) {
		waitUntil(t, what, 20*time.Second, func() bool {
			n := 0
			st.streams.each(func(key string, r *streamRecord, _ uint64) {
				if r.Kind == policy.RequestStream {
					n++
				}
			})
			return n <= buffer.EndedStreamsKept && st.Stats().RetainedBytes == 0
		})
		time.Sleep(200 * time.Millisecond)
	}
	settled("the first calls to be evicted")
	tap.since()
	began := time.Now()
	scans := st.scans.Load()

	const calls = 20
	for i := 1; i <= calls; i++ {
		shortCall(t, sess, fmt.Sprint(i))
	}
	during := tap.since()
	// What the calls leave: deliveries recorded, eviction once the window
	// has passed, the ended streams retired.
	settled("the calls' events to be evicted and their records retired")
	after := tap.since()
	checkIndex(t, st)
	// The health loop purges its probe message and the budget reads the
	// events stream's size once a second each, whatever the calls do.
	perSecond := (time.Since(began).Seconds() + 1) / calls
	// Each scan of the zone (every 10 sweep intervals, whatever the calls
	// do) watches the four buckets, a consumer each, created and deleted.
	perScan := float64(4*(st.scans.Load()-scans+1)) / calls
	all := make(map[string]int)
	for _, c := range []map[string]int{during, after} {
		for k, v := range c {
			all[k] += v
		}
	}
	checkIndex(t, st)
	t.Logf("during the calls:%s", describe(during, calls))
	t.Logf("after them (eviction, retirement):%s", describe(after, calls))

	// One call, as the store makes it now: the session's stream number
	// (1 session write); the producer lease taken and released (2 lease
	// writes); the stream record created with the reader attached
	// (OpenCall: one write, two before), the end written with the
	// reader's deliveries and its leaving (one: it has everything by
	// then) (2), the
	// floor moved past everything once the window is over and the record
	// retired (2); the events stored (1 or 2 publishes: the progress and
	// the result may share one), and no end marker (its only reader left
	// with the end: none needs it, one before); the events purged
	// with the floor move (1: the retired record's delete marker expires
	// by itself, recordMarkerTTL, where tidy purged it before). No
	// consumer, no search for a message, no direct get: the reader is fed
	// by the writer here. (Before: 36 operations, 1 consumer created and
	// deleted, 8.4 stream record writes.)
	// The bounds allow a little over the figures above: a call the machine
	// slows past the end's wait for its relay (5 ms) writes its client's
	// leaving apart, and a write that meets another retries.
	for _, b := range []perCallBound{
		{"KV writes, sessions", is("kv write sessions"), 1},
		{"KV writes, streams", is("kv write streams"), 4.3},
		{"KV writes, leases", is("kv write leases"), 2},
		{"KV writes, tombstones", is("kv write tombs"), 0},
		{"event publishes", is("event publish"), 2},
		{"consumer creates", is("consumer create"), perScan},
		{"consumer deletes", is("consumer delete"), perScan},
		{"pull requests", is("pull request"), 0},
		{"direct gets", is("direct get"), 0.3},
		{"purges", is("purge"), 1 + perSecond},
		{"notifications", is("notification"), 4.3 + 2 + 1 + perSecond},
		{"all operations", func(k string) bool {
			return k != "delivery" && k != "notification" && !strings.HasPrefix(k, "watch consumer")
		}, 9.7 + 2*perSecond + 2*perScan},
	} {
		if got := float64(total(all, b.match)) / calls; got > b.max+1e-9 {
			t.Errorf("%s: %.2f per call, more than %v", b.kind, got, b.max)
		}
	}
}

// checkIndex compares what the index says of every incarnation with a walk
// of the stream records, and the sessions tally with one of the sessions.
func checkIndex(t testing.TB, st *Store) {
	t.Helper()
	type walk struct {
		live     int
		retained int64
		latest   map[string]uint32
	}
	walks := make(map[string]*walk)
	st.streams.each(func(key string, r *streamRecord, _ uint64) {
		inc, num, _ := splitStreamKey(key)
		w := walks[inc]
		if w == nil {
			w = &walk{latest: make(map[string]uint32)}
			walks[inc] = w
		}
		if r.Kind == policy.RequestStream && r.State == policy.Live {
			w.live++
		}
		w.retained += r.retained()
		if r.Kind == policy.RequestStream && len(r.Key) > 0 {
			w.latest[string(r.Key)] = max(w.latest[string(r.Key)], num)
		}
	})
	var sessions policy.SessionCounts
	st.sessions.each(func(_ string, r *sessionRecord, _ uint64) {
		switch r.origin() {
		case policy.Adopted:
			sessions.Adopted++
		case policy.Untapped:
			sessions.Untapped++
		default:
			sessions.Sessions++
		}
	})
	if c := st.tally.counts(); c != sessions {
		t.Errorf("the tally counts %+v sessions, the records %+v", c, sessions)
	}
	for inc, w := range walks {
		if n := st.incs.liveRequests(inc); n != w.live {
			t.Errorf("%s: the index counts %d live request streams, the records %d", inc, n, w.live)
		}
		if n := st.incs.retained(inc); n != w.retained {
			t.Errorf("%s: the index says %d bytes retained, the records %d", inc, n, w.retained)
		}
		for k, num := range w.latest {
			if n := st.incs.latest(inc, []byte(k)); n != num {
				t.Errorf("%s: the index finds stream %d for a request, the records %d", inc, n, num)
			}
		}
	}
}
