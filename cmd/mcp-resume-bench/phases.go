package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
)

// setup is one of the two ways through the same Caddy to the same upstream.
type setup struct {
	name   string
	base   string
	resume bool
}

type bench struct {
	cfg    config
	up     *mcptest.Upstream
	px     *proxy
	hc     *http.Client // every session's connections
	plain  setup
	resume setup
	logf   func(format string, args ...any)
}

// order alternates which setup runs first, round by round, so that drifting
// machine noise hits both alike.
func (b *bench) order(round int) []setup {
	if round%2 == 0 {
		return []setup{b.plain, b.resume}
	}
	return []setup{b.resume, b.plain}
}

// usage returns the process's user+system CPU time and its context switches
// (voluntary and involuntary, over all threads) so far.
func usage() (time.Duration, int64) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ru.Nvcsw + ru.Nivcsw
}

var progressPrefix = []byte(`{"jsonrpc":"2.0","method":"notifications/progress"`)

// drain reads a tools/call stream to its end: progress events, then the
// response. onEvent (optional) sees each progress event as it is read.
func drain(body io.Reader, onEvent func(ev mcptest.RawEvent)) (events, payload int64, err error) {
	rd := mcptest.NewSSEReader(body, 64<<10)
	gotResponse := false
	for {
		ev, err := rd.NextRaw()
		if err == io.EOF {
			break
		}
		if err != nil {
			return events, payload, err
		}
		if len(ev.Data) == 0 {
			continue // no message: nothing the benchmark asked for
		}
		if bytes.HasPrefix(ev.Data, progressPrefix) {
			events++
			payload += int64(len(ev.Data))
			if onEvent != nil {
				onEvent(ev)
			}
			continue
		}
		if bytes.Contains(ev.Data, []byte(`"result"`)) {
			gotResponse = true
		} else {
			return events, payload, fmt.Errorf("unexpected event %q: %.200s", ev.Type, ev.Data)
		}
	}
	if !gotResponse {
		return events, payload, errors.New("stream ended without the JSON-RPC response")
	}
	return events, payload, nil
}

// ---- 1 + 5: throughput and CPU per event ----------------------------------------

type tpConfig struct {
	size, streams, total int // total progress events per run, over all streams
}

func (c tpConfig) key() string {
	return fmt.Sprintf("%s events, %d stream%s", sizeName(c.size), c.streams, plural(c.streams))
}

func sizeName(size int) string {
	if size >= 1024 && size%1024 == 0 {
		return fmt.Sprintf("%d KiB", size/1024)
	}
	return fmt.Sprintf("%d B", size)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

type tpResult struct {
	events, payload int64
	elapsed, cpu    time.Duration
	csw             int64   // context switches of the process during the run
	stalls          float64 // backpressure stalls during the run (mcp_resume)
}

const metricStalls = "caddy_mcp_resume_backpressure_stalls_total"

func (r tpResult) eventsPerSec() float64 { return float64(r.events) / r.elapsed.Seconds() }
func (r tpResult) mbPerSec() float64     { return float64(r.payload) / 1e6 / r.elapsed.Seconds() }
func (r tpResult) cpuPerEvent() float64  { return float64(r.cpu.Microseconds()) / float64(r.events) }
func (r tpResult) cswPerEvent() float64  { return float64(r.csw) / float64(r.events) }

// throughput runs cfg.streams concurrent tools/calls, each in its own
// session, each streaming as fast as the upstream can write.
func (b *bench) throughput(ctx context.Context, s setup, c tpConfig) (tpResult, error) {
	per := max(c.total/c.streams, 1)
	sessions, err := b.openSessions(ctx, s.base, c.streams, 16)
	defer closeSessions(context.WithoutCancel(ctx), sessions, 16)
	if err != nil {
		return tpResult{}, err
	}
	var before mcptest.Metrics
	if s.resume {
		if before, err = b.px.metrics(); err != nil {
			return tpResult{}, err
		}
	}
	runtime.GC()
	var events, payload atomic.Int64
	cpu0, csw0 := usage()
	t0 := time.Now()
	err = mcptest.Parallel(c.streams, c.streams, func(i int) error {
		resp, err := sessions[i].Call(ctx, 1, "stream", mcptest.StreamArgs{N: per, Size: c.size}, token)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		n, p, err := drain(resp.Body, nil)
		events.Add(n)
		payload.Add(p)
		if err == nil && n != int64(per) {
			err = fmt.Errorf("%s: got %d of %d events", s.name, n, per)
		}
		return err
	})
	elapsed := time.Since(t0)
	cpu1, csw1 := usage()
	r := tpResult{events: events.Load(), payload: payload.Load(), elapsed: elapsed, cpu: cpu1 - cpu0, csw: csw1 - csw0}
	if s.resume && err == nil {
		after, err := b.px.metrics()
		if err != nil {
			return r, err
		}
		r.stalls = total(after, metricStalls) - total(before, metricStalls)
	}
	return r, err
}

// ---- 2: latency -------------------------------------------------------------------

type latResult struct{ p50, p99, max float64 } // microseconds

// latency streams paced events with their write time embedded and measures
// upstream write -> client read for each.
func (b *bench) latency(ctx context.Context, s setup) (latResult, error) {
	sessions, err := b.openSessions(ctx, s.base, 1, 1)
	defer closeSessions(context.WithoutCancel(ctx), sessions, 1)
	if err != nil {
		return latResult{}, err
	}
	runtime.GC()
	resp, err := sessions[0].Call(ctx, 1, "stream", mcptest.StreamArgs{
		N: b.cfg.latencyEvents, Size: b.cfg.latencySize, TS: true, IntervalMS: float64(b.cfg.latencyInterval) / float64(time.Millisecond),
	}, token)
	if err != nil {
		return latResult{}, err
	}
	defer resp.Body.Close()
	lats := make([]float64, 0, b.cfg.latencyEvents)
	_, _, err = drain(resp.Body, func(ev mcptest.RawEvent) {
		now := time.Now().UnixNano()
		if ts, ok := parseTS(ev.Data); ok {
			lats = append(lats, float64(now-ts)/1e3)
		}
	})
	if err == nil && len(lats) != b.cfg.latencyEvents {
		err = fmt.Errorf("latency: %d of %d timestamps", len(lats), b.cfg.latencyEvents)
	}
	return latResult{p50: percentile(lats, 50), p99: percentile(lats, 99), max: percentile(lats, 100)}, err
}

// ---- 3: resume ----------------------------------------------------------------

type resumeResult struct {
	fill      time.Duration // upstream release -> stream complete in the log (no client)
	ttfb      time.Duration // GET sent -> first replayed event read
	replay    time.Duration // GET sent -> end of the replayed stream
	events    int64
	payload   int64
	filledEPS float64
}

func (r resumeResult) eventsPerSec() float64 { return float64(r.events) / r.replay.Seconds() }
func (r resumeResult) mbPerSec() float64     { return float64(r.payload) / 1e6 / r.replay.Seconds() }

// token is the progress token of every call.
const token = "b"

// holdToken names a hold of the upstream.
func holdToken() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// waitStream polls the admin API until cond holds for a session's stream.
func (b *bench) waitStream(sid string, num uint32, timeout time.Duration, what string, cond func(buffer.StreamInfo) bool) error {
	deadline := time.Now().Add(timeout)
	for {
		s, _, err := mcptest.Session(b.px.admin, sid)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(s.Streams, func(st buffer.StreamInfo) bool { return st.Num == num })
		if i < 0 {
			return fmt.Errorf("session %s has no stream %d", sid, num)
		}
		st := s.Streams[i]
		if cond(st) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s (state %s, connected %v)", timeout, what, st.State, st.Connected)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// detached is a waitStream condition: no client reads the stream.
func detached(st buffer.StreamInfo) bool { return !st.Connected }

// resumeRun: a client reads a few events and drops; the upstream then
// finishes into the log; a GET with the last seen Last-Event-ID replays the
// rest (n-pre events and the response) from the log to the end.
func (b *bench) resumeRun(ctx context.Context, n int) (resumeResult, error) {
	const pre = 5
	sessions, err := b.openSessions(ctx, b.resume.base, 1, 1)
	defer closeSessions(context.WithoutCancel(ctx), sessions, 1)
	if err != nil {
		return resumeResult{}, err
	}
	cl, sid := sessions[0], sessions[0].SessionID
	hold := holdToken()
	b.up.Hold(hold)
	defer b.up.Release(hold)
	resp, err := cl.Call(ctx, 1, "stream", mcptest.StreamArgs{N: n, Size: b.cfg.replaySize, Pre: pre, Hold: hold}, token)
	if err != nil {
		return resumeResult{}, err
	}
	rd := mcptest.NewSSEReader(resp.Body, 64<<10)
	var lastID string
	for got := 0; got < pre; {
		ev, err := rd.NextRaw()
		if err != nil {
			resp.Body.Close()
			return resumeResult{}, fmt.Errorf("reading the first events: %v", err)
		}
		if bytes.HasPrefix(ev.Data, progressPrefix) {
			got++
			lastID = string(ev.ID)
		}
	}
	resp.Body.Close()
	id, err := eventid.Parse(lastID)
	if err != nil {
		return resumeResult{}, fmt.Errorf("event id %q: %v", lastID, err)
	}
	// Release the upstream only once the proxy has noticed the client left,
	// so every further event stays undelivered in the log.
	if err := b.waitStream(sid, id.Stream, 10*time.Second, "the client to detach", detached); err != nil {
		return resumeResult{}, err
	}
	runtime.GC()
	t0 := time.Now()
	b.up.Release(hold)
	if err := b.waitStream(sid, id.Stream, 2*time.Minute, "the stream to complete",
		func(st buffer.StreamInfo) bool { return st.State != "live" }); err != nil {
		return resumeResult{}, err
	}
	r := resumeResult{fill: time.Since(t0)}
	r.filledEPS = float64(n-pre) / r.fill.Seconds()

	runtime.GC()
	t1 := time.Now()
	resp, err = cl.Resume(ctx, lastID)
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return r, fmt.Errorf("resume: %d", resp.StatusCode)
	}
	first := true
	r.events, r.payload, err = drain(resp.Body, func(mcptest.RawEvent) {
		if first {
			r.ttfb, first = time.Since(t1), false
		}
	})
	r.replay = time.Since(t1)
	if err == nil && r.events != int64(n-pre) {
		err = fmt.Errorf("replay: got %d of %d events", r.events, n-pre)
	}
	return r, err
}

// ---- 4: memory ----------------------------------------------------------------

type memSnap struct{ heap, rss int64 }

func snapshot() memSnap {
	runtime.GC()
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s := memSnap{heap: int64(ms.HeapAlloc)}
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		s.rss, _ = statmRSS(string(b), os.Getpagesize())
	}
	return s
}

type memResult struct {
	initRate        float64 // sessions opened per second (initialize + initialized)
	idle            memSnap // delta for n idle sessions
	retained        memSnap // further delta once each session retains events
	retainedPayload int64   // stored event bytes: retained_bytes without its 64 B per event
}

// memory opens n idle sessions and measures what they hold; with mcp_resume
// each session then retains one undelivered tools/call stream (the client
// drops right after the response headers) and that is measured too.
func (b *bench) memory(ctx context.Context, s setup, n int) (memResult, error) {
	var r memResult
	m0 := snapshot()
	t0 := time.Now()
	sessions, err := b.openSessions(ctx, s.base, n, 8)
	defer closeSessions(context.WithoutCancel(ctx), sessions, 8)
	if err != nil {
		return r, err
	}
	r.initRate = float64(n) / time.Since(t0).Seconds()
	m1 := snapshot()
	r.idle = memSnap{heap: m1.heap - m0.heap, rss: m1.rss - m0.rss}
	if !s.resume {
		return r, nil
	}
	before, err := b.px.metrics()
	if err != nil {
		return r, err
	}
	k := b.cfg.retainEvents
	err = mcptest.Parallel(n, 8, func(i int) error {
		hold := holdToken()
		b.up.Hold(hold)
		defer b.up.Release(hold)
		resp, err := sessions[i].Call(ctx, 1, "stream", mcptest.StreamArgs{N: k, Size: b.cfg.retainSize, Hold: hold}, token)
		if err != nil {
			return err
		}
		resp.Body.Close()
		return b.waitStream(sessions[i].SessionID, 1, 10*time.Second, "the client to detach", detached)
	})
	if err != nil {
		return r, err
	}
	// Wait until every upstream response is in the log.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		m, err := b.px.metrics()
		if err != nil {
			return r, err
		}
		// A scrape reads the counters before the gauges, so a stream that
		// finished in between shows no upstream read yet not all its events:
		// wait for the count, not just for the reads to end.
		events := total(m, "caddy_mcp_resume_events_enqueued_total") - total(before, "caddy_mcp_resume_events_enqueued_total")
		want := int64(n) * int64(k+1)
		if b.up.Active() == 0 && total(m, "caddy_mcp_resume_upstream_reads") == 0 && int64(events) == want {
			retained := total(m, "caddy_mcp_resume_retained_bytes") - total(before, "caddy_mcp_resume_retained_bytes")
			r.retainedPayload = int64(retained) - int64(events)*64
			break
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("memory: timed out waiting for the upstream responses: %v events enqueued, want %d", events, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	m2 := snapshot()
	r.retained = memSnap{heap: m2.heap - m1.heap, rss: m2.rss - m1.rss}
	return r, nil
}

// loadSample records the machine's busy CPU time and this process's own, to
// tell how much other processes competed with the benchmark.
type loadSample struct {
	busy time.Duration // all CPUs, from /proc/stat
	own  time.Duration
	at   time.Time
	ok   bool
}

const clockTicks = 100 // USER_HZ on Linux

func sampleLoad() loadSample {
	own, _ := usage()
	s := loadSample{own: own, at: time.Now()}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		if busy, _, err := procStatCPU(string(b)); err == nil {
			s.busy, s.ok = time.Duration(busy)*time.Second/clockTicks, true
		}
	}
	return s
}

// otherCores is the average number of cores other processes kept busy
// between s0 and s; NaN if unknown.
func (s loadSample) otherCores(s0 loadSample) float64 {
	if !s.ok || !s0.ok {
		return math.NaN()
	}
	other := (s.busy - s0.busy) - (s.own - s0.own)
	return max(other.Seconds(), 0) / s.at.Sub(s0.at).Seconds()
}
