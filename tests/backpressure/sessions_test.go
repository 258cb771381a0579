package backpressure

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// Many sessions at once against one upstream that floods every tool call:
// fast clients read everything, slow clients read with pauses, vanished
// clients read a few events and disconnect, never to return. The process
// (which hosts Caddy, the upstream and the clients) must stay within
// max_total_bytes plus a per-connection overhead, the retained bytes must
// never exceed max_total_bytes, fast and slow sessions get every event
// exactly once, slow ones meet backpressure, and the vanished ones hold their
// upstreams stalled instead of buffering them.
func TestManySessionsBoundedMemory(t *testing.T) {
	harness.MemoryStoreOnly(t, heapVersusRetained)
	const (
		perKind   = 80 // fast, slow, vanished: 240 sessions
		eventSize = 1024
		nFast     = 300  // 300 KiB per call, > max_stream_bytes
		nSlow     = 700  // 700 KiB: well past the log and the sockets' buffers
		nVanished = 2000 // 2 MiB each would be 160 MiB if nothing pushed back
		maxStream = 128 << 10
		maxTotal  = 16 << 20
		// Heap a session costs outside the retention logs while its stream is
		// open, all three parties counted (the test process hosts them): the
		// client transport's and Caddy's server-side bufio (2x4 KiB each),
		// Caddy's upstream transport bufio (2x4 KiB) and reverse_proxy's copy
		// buffer (32 KiB), the relay's batch (<= 64 events, ~66 KiB here),
		// the SSE parser's partial event, the upstream's bufio (2x4 KiB) and
		// the client's reader (4 KiB), plus goroutine and request state.
		// The relay's batch is counted twice: its copy of up to 64 events,
		// and the references its event slice keeps to the last batch after
		// the log evicted it (see TestSlowConsumerRelayMemory). Measured:
		// 57-63 MiB grown for 240 sessions with ~16 MiB retained, i.e.
		// 170-200 KiB a session; 40-48 MiB once the relay writes events
		// without copying them. If nothing pushed back, the vanished
		// sessions alone would add 160 MiB.
		perSessionOverhead = 288 << 10
	)
	f, c := harness.FloodProxy(t, 16<<10, `
			max_stream_bytes 128KiB
			max_session_bytes 256KiB
			max_total_bytes 16MiB
			max_event_bytes 32KiB
			max_sessions 1000
			resume_window 1s
			stall_timeout 60s`)

	type kind int
	const (
		fast kind = iota
		slow
		vanished
	)
	kindName := [...]string{"fast", "slow", "vanished"}
	type sess struct {
		kind kind
		cl   *harness.StreamClient
		tr   harness.Tracker
		err  error
	}
	all := make([]*sess, 3*perKind)
	bySID := make(map[string]*sess)
	for i := range all {
		all[i] = &sess{kind: kind(i % 3), cl: harness.NewStreamClient(c.Base(), "2025-06-18")}
		defer all[i].cl.Close()
	}
	if err := mcptest.Parallel(len(all), 16, func(i int) error { return all[i].cl.Init() }); err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		bySID[s.cl.SessionID] = s
	}
	baseline := mcptest.SettledHeap()

	// Watch: retained bytes (admin API and the metric), who is stalled,
	// and the live heap, each on its own clock.
	var (
		mu             sync.Mutex
		maxRetained    int64
		maxGauge       float64
		maxHeap        uint64
		stalledSeen    = make(map[string]bool)
		samples        int
		stopWatch      = make(chan struct{})
		watchers       sync.WaitGroup
		metricExposed  = true
		gaugeSamples   int
		maxStreamBytes int64
		heapSamples    int
	)
	watch := func(every time.Duration, sample func()) {
		watchers.Add(1)
		go func() {
			defer watchers.Done()
			for {
				select {
				case <-stopWatch:
					return
				case <-time.After(every):
				}
				sample()
			}
		}()
	}
	start := time.Now()
	// The retained_bytes metric is read under the store's byte lock: a
	// consistent total.
	watch(100*time.Millisecond, func() {
		if m, err := c.Metrics(); err == nil {
			v, ok := m.Sum("caddy_mcp_resume_retained_bytes")
			mu.Lock()
			metricExposed = metricExposed && ok
			maxGauge = max(maxGauge, v)
			gaugeSamples++
			mu.Unlock()
		}
	})
	// The admin API's per-session figures are taken one after another while
	// bytes move, so their sum is only indicative; each stream's own figure
	// is consistent. A slow session is stalled only until its next read, so
	// this sampler runs on its own: on a loaded machine, waiting for the
	// metrics scrape or a GC between samples thinned them out so much that
	// some slow sessions were never caught stalled.
	watch(100*time.Millisecond, func() {
		ss, err := c.Sessions()
		if err != nil {
			return
		}
		var sum int64
		mu.Lock()
		defer mu.Unlock()
		for _, se := range ss {
			sum += se.Bytes
			for _, st := range se.Streams {
				if st.Stalled || st.Stalls > 0 { // stalls counts those between samples
					stalledSeen[se.ID] = true
				}
				maxStreamBytes = max(maxStreamBytes, st.Bytes)
			}
		}
		maxRetained = max(maxRetained, sum)
		samples++
	})
	watch(500*time.Millisecond, func() {
		h := mcptest.LiveHeap()
		mu.Lock()
		maxHeap = max(maxHeap, h)
		heapSamples++
		mu.Unlock()
	})

	done := make(chan string, len(all))
	for _, s := range all {
		go func(s *sess) {
			defer func() { done <- kindName[s.kind] }()
			n := map[kind]int{fast: nFast, slow: nSlow, vanished: nVanished}[s.kind]
			st, err := s.cl.CallStream(1, "flood", harness.FloodArgs(n, eventSize), 30*time.Second)
			if err != nil {
				s.err = err
				return
			}
			defer st.Close()
			for !s.tr.Done {
				ev, err := st.Next()
				if err != nil {
					s.err = fmt.Errorf("%s session %s after %d events: %w", kindName[s.kind], s.cl.SessionID, s.tr.Events, err)
					return
				}
				if err := s.tr.Take(ev, 1); err != nil {
					s.err = fmt.Errorf("%s session %s: %w", kindName[s.kind], s.cl.SessionID, err)
					return
				}
				switch {
				case s.kind == vanished && s.tr.Progress == 5:
					return // disconnects mid-stream, never comes back
				case s.kind == slow && s.tr.Progress%25 == 0:
					time.Sleep(100 * time.Millisecond) // a slow consumer's pace
				}
			}
		}(s)
	}
	finished := map[string]int{}
	timeout := time.After(90 * time.Second)
	for range all {
		select {
		case k := <-done:
			finished[k]++
			if finished["fast"] == perKind && finished["fast"]+finished["slow"]+finished["vanished"] < len(all) {
				if _, ok := finished["fast-at"]; !ok {
					finished["fast-at"] = int(time.Since(start).Milliseconds())
				}
			}
		case <-timeout:
			t.Fatalf("sessions still running after 90s: finished %v", finished)
		}
	}
	elapsed := time.Since(start)
	// The vanished sessions' upstreams stay stalled; measure once more.
	if !mcptest.Eventually(10*time.Second, 100*time.Millisecond, func() bool {
		ss, err := c.Sessions()
		if err != nil {
			return false
		}
		n := 0
		for _, se := range ss {
			if s := bySID[se.ID]; s != nil && s.kind == vanished && len(se.Streams) == 1 && se.Streams[0].Stalled {
				n++
			}
		}
		return n == perKind
	}) {
		t.Errorf("not every vanished session's stream is stalled")
	}
	endHeap := mcptest.LiveHeap()
	close(stopWatch)
	watchers.Wait()

	for _, s := range all {
		if s.err != nil {
			t.Error(s.err)
			continue
		}
		if s.kind == vanished {
			fc := harness.FloodCall(t, f, s.cl.SessionID)
			if w := fc.Written.Load(); w >= nVanished*eventSize {
				t.Errorf("vanished session %s: the upstream wrote all %d bytes", s.cl.SessionID, w)
			}
			continue
		}
		n := map[kind]int{fast: nFast, slow: nSlow}[s.kind]
		if !s.tr.Done || s.tr.Progress != n || s.tr.LastSeq != uint64(n+1) || len(s.tr.Gaps) > 0 || s.tr.ErrorMsg != "" {
			t.Errorf("%s session %s: progress %d, last seq %d, done %v, gaps %v, error %q",
				kindName[s.kind], s.cl.SessionID, s.tr.Progress, s.tr.LastSeq, s.tr.Done, s.tr.Gaps, s.tr.ErrorMsg)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	slowStalled := 0
	for sid := range stalledSeen {
		if s := bySID[sid]; s != nil && s.kind == slow {
			slowStalled++
		}
	}
	peak := max(maxHeap, endHeap)
	grown := int64(peak) - int64(baseline)
	bound := int64(maxTotal + len(all)*perSessionOverhead)
	t.Logf("%d sessions: fast done after %dms, all readers done after %v; %d admin samples, %d heap samples", len(all), finished["fast-at"], elapsed.Round(time.Millisecond), samples, heapSamples)
	t.Logf("retained_bytes metric: peak %.0f of max_total_bytes %d (%d samples; admin per-session sum, not a snapshot: peak %d); largest stream %d of max_stream_bytes %d",
		maxGauge, maxTotal, gaugeSamples, maxRetained, maxStreamBytes, maxStream)
	t.Logf("live heap: baseline %d, peak %d, end %d: grown %d B = %.1f MiB; bound max_total_bytes + %d x %d KiB = %.1f MiB",
		baseline, peak, endHeap, grown, float64(grown)/(1<<20), len(all), perSessionOverhead>>10, float64(bound)/(1<<20))
	t.Logf("slow sessions seen stalled: %d of %d", slowStalled, perKind)
	if !metricExposed || gaugeSamples == 0 {
		t.Fatalf("admin /metrics does not expose caddy_mcp_resume_retained_bytes")
	}
	if maxGauge > maxTotal {
		t.Errorf("retained_bytes reached %.0f > max_total_bytes %d", maxGauge, maxTotal)
	}
	if maxStreamBytes > maxStream {
		t.Errorf("a stream retained %d B > max_stream_bytes %d", maxStreamBytes, maxStream)
	}
	if maxGauge < maxTotal/2 {
		t.Errorf("retained_bytes peaked at %.0f: the load never pressed on max_total_bytes %d", maxGauge, maxTotal)
	}
	if grown > bound {
		t.Errorf("live heap grew by %d B > max_total_bytes + overhead = %d B", grown, bound)
	}
	if slowStalled < perKind*9/10 {
		t.Errorf("only %d of %d slow sessions were seen stalled", slowStalled, perKind)
	}
	harness.AssertNoEarlyEviction(t, c)
}

// Slow consumers must not make the proxy hold more than max_total_bytes
// plus fixed per-connection buffers. Clients that read one ~28 KiB event every
// 100 ms keep their relays blocked in writes with their logs full; the heap
// (live objects after GC; the process hosts Caddy, upstream and clients) is
// measured against max_total_bytes plus, per session, the buffers a
// connection needs whatever the bounds (bufio, the reverse_proxy copy buffer,
// the SSE parser's partial event and the one event waiting in Append, <=
// max_event_bytes each), plus a fixed 4 MiB for what the process initialises
// lazily (TLS roots and the like).
//
// The event size makes the log's copy of an event (payload + 17 B of
// framing) exactly 28672 B, a Go size class, so allocator rounding (up to
// 12.5% on top of retained_bytes for other sizes) does not blur the result.
func TestSlowConsumerRelayMemory(t *testing.T) {
	harness.MemoryStoreOnly(t, heapVersusRetained)
	const (
		sessions  = 16
		eventSize = 28672 - 17
		n         = 1000 // 28 MiB a call, if nothing pushed back
		maxTotal  = 16 << 20
		maxEvent  = 64 << 10
		// bufio: client transport, Caddy server, Caddy upstream transport,
		// upstream server (2x4 KiB each) and the client's reader (4 KiB);
		// reverse_proxy's copy buffer (32 KiB); the parser's partial event
		// and the event blocked in Append (max_event_bytes each); the
		// upstream's event buffer; 16 KiB of request, goroutine and stream
		// state.
		perSession   = 9*(4<<10) + 32<<10 + 2*maxEvent + eventSize + 16<<10
		processFixed = 4 << 20
	)
	_, c := harness.FloodProxy(t, 16<<10, `
			max_stream_bytes 1MiB
			max_session_bytes 1MiB
			max_total_bytes 16MiB
			max_event_bytes 64KiB
			resume_window 1s
			stall_timeout 60s`)
	clients := make([]*harness.StreamClient, sessions)
	for i := range clients {
		clients[i] = harness.StreamSession(t, c)
	}
	baseline := mcptest.SettledHeap()
	stop := make(chan struct{})
	errs := make(chan error, sessions)
	var wg sync.WaitGroup
	for _, cl := range clients {
		wg.Add(1)
		go func(cl *harness.StreamClient) {
			defer wg.Done()
			st, err := cl.CallStream(1, "flood", harness.FloodArgs(n, eventSize), 30*time.Second)
			if err != nil {
				errs <- err
				return
			}
			defer st.Close()
			var tr harness.Tracker
			for {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				ev, err := st.Next()
				if err == nil {
					err = tr.Take(ev, 1)
				}
				if err != nil {
					errs <- fmt.Errorf("session %s: %w", cl.SessionID, err)
					return
				}
			}
		}(cl)
	}
	var peak uint64
	var maxRetained float64
	for i := 0; i < 16; i++ {
		time.Sleep(400 * time.Millisecond) // a sample every 400ms while the slow readers run
		peak = max(peak, mcptest.LiveHeap())
		if m, err := c.Metrics(); err == nil {
			v, _ := m.Sum("caddy_mcp_resume_retained_bytes")
			maxRetained = max(maxRetained, v)
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	grown := int64(peak) - int64(baseline)
	bound := int64(maxTotal + sessions*perSession + processFixed)
	t.Logf("%d slow sessions: retained_bytes peak %.0f of max_total_bytes %d; live heap grew %.1f MiB (baseline %.1f MiB); bound max_total_bytes + %d x %d KiB + %d MiB = %.1f MiB",
		sessions, maxRetained, maxTotal, float64(grown)/(1<<20), float64(baseline)/(1<<20), sessions, perSession>>10, processFixed>>20, float64(bound)/(1<<20))
	if maxRetained > maxTotal {
		t.Errorf("retained_bytes %.0f > max_total_bytes %d", maxRetained, maxTotal)
	}
	if grown > bound {
		t.Errorf("live heap grew by %.1f MiB > max_total_bytes + per-connection buffers = %.1f MiB: slow consumers make the proxy hold event data outside its retention bounds",
			float64(grown)/(1<<20), float64(bound)/(1<<20))
	}
	harness.AssertNoEarlyEviction(t, c)
}

// The reserve protects the clients that are there (review item 7): eight
// sessions start chatty calls and hang up, filling what streams without a
// client may hold; an unrelated client's call still gets every event.
func TestTheReserveServesConnectedClients(t *testing.T) {
	f, c := harness.FloodProxy(t, 0, `
			max_total_bytes 1MiB
			max_session_bytes 128KiB
			max_stream_bytes 128KiB
			stall_timeout 1m`)
	f.Hold("flood")
	for i := 0; i < 8; i++ {
		cl := harness.NewStreamClient(c.Base(), "2025-06-18")
		if err := cl.Init(); err != nil {
			t.Fatal(err)
		}
		args := harness.FloodArgs(100000, 200)
		args.Pre, args.Hold = 1, "flood" // the rest once every client has left
		s, err := cl.CallStream(1, "flood", args, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		s.Next()
		s.Close() // hang up
		defer cl.Close()
	}
	harness.WaitFor(t, 10*time.Second, "the clients to be gone", func() bool {
		ss, _ := c.Sessions()
		gone := 0
		for _, se := range ss {
			for _, st := range se.Streams {
				if st.Kind == "request" && st.Head >= 1 && !st.Connected {
					gone++
				}
			}
		}
		return gone == 8
	})
	f.Release("flood")
	harness.WaitFor(t, 20*time.Second, "the hung-up sessions to fill what they may", func() bool {
		m, _ := c.Metrics()
		return m.Series["caddy_mcp_resume_stalled_streams"] == 8
	})
	cl := harness.StreamSession(t, c)
	s, err := cl.CallStream(2, "flood", harness.FloodArgs(5, 200), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var tr harness.Tracker
	if _, err := harness.Drain(cl, s, &tr, 2, 100, 0); err != nil {
		harness.DumpState(t, c)
		t.Fatal(err)
	}
	if tr.Progress != 5 || tr.ErrorMsg != "" || len(tr.Gaps) != 0 {
		t.Fatalf("the connected client got %d of 5 events, error %q, gaps %+v", tr.Progress, tr.ErrorMsg, tr.Gaps)
	}
}
