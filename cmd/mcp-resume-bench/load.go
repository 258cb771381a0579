package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
)

// The load process (this binary with -load) runs the upstream and the
// clients, so that the proxy's process does nothing else. It reads one
// command a line on stdin and answers with one result a line on stdout;
// around what it measures it writes a mark and waits for the proxy's
// process to take its readings.

// command is one run the proxy's process asks for.
type command struct {
	Op            string // throughput, latency, resume, calls, churn
	Base          string // where the clients go: a proxy, or the upstream (direct)
	Admin         string // Caddy's admin endpoint (resume)
	Size, Streams int
	Total         int // events over all streams; resume: retained events
}

// result is what the load process measured; CPU is its own.
type result struct {
	Mark            bool `json:",omitempty"` // not a result: take a reading, then answer
	Err             string
	Events, Payload int64
	Elapsed, CPU    time.Duration
	P50, P99, Max   float64 // latency, µs
	TTFB, Fill      time.Duration
}

const (
	protocolVersion = "2025-06-18" // resumable, no priming event
	latencyEvery    = 2 * time.Millisecond
	replaySize      = 1024 // resume phase
)

type loader struct {
	up  *mcptest.Upstream
	hc  *http.Client
	in  *bufio.Scanner
	out *json.Encoder
}

func loadMain() error {
	l := &loader{up: &mcptest.Upstream{Version: protocolVersion, FlushEach: true}, in: bufio.NewScanner(os.Stdin),
		out: json.NewEncoder(os.Stdout), hc: &http.Client{Transport: &http.Transport{
			MaxIdleConns: 1024, MaxIdleConnsPerHost: 512, IdleConnTimeout: time.Minute, DisableCompression: true}}}
	ln, err := mcptest.Listen(0)
	if err != nil {
		return err
	}
	go (&http.Server{Handler: l.up, ReadHeaderTimeout: 10 * time.Second}).Serve(ln)
	fmt.Println(ln.Addr().String())
	ops := map[string]func(context.Context, command) (result, error){
		"throughput": l.throughput, "latency": l.latency, "resume": l.resume, "calls": l.calls, "churn": l.churn}
	for l.in.Scan() {
		var c command
		if err := json.Unmarshal(l.in.Bytes(), &c); err != nil || ops[c.Op] == nil {
			return fmt.Errorf("bad command %q", l.in.Bytes())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		r, err := ops[c.Op](ctx, c)
		if cancel(); err != nil {
			r.Err = fmt.Sprintf("%s on %s: %v", c.Op, c.Base, err)
		}
		if err := l.out.Encode(r); err != nil {
			return err
		}
	}
	return l.in.Err()
}

// mark starts or ends what is measured: the proxy's process takes its
// readings, then this process its own.
func (l *loader) mark() time.Duration {
	l.out.Encode(result{Mark: true})
	l.in.Scan()
	return usage()
}

// open opens n sessions on base; closeAll deletes them.
func (l *loader) open(ctx context.Context, base string, n int) (cs []*mcptest.Client, closeAll func(), err error) {
	cs = make([]*mcptest.Client, n)
	err = mcptest.Parallel(n, 16, func(i int) error {
		cs[i] = mcptest.NewClient(base, protocolVersion, l.hc)
		return cs[i].Initialize(ctx)
	})
	return cs, func() {
		mcptest.Parallel(n, 16, func(i int) error {
			if cs[i] != nil && cs[i].SessionID != "" {
				cs[i].Delete(context.WithoutCancel(ctx))
			}
			return nil
		})
	}, err
}

var progressPrefix = []byte(`{"jsonrpc":"2.0","method":"notifications/progress"`)

// drain reads a tools/call stream to its end: progress events (each seen by
// onEvent, if set), then the response.
func drain(body io.Reader, onEvent func(ev mcptest.RawEvent)) (events, payload int64, err error) {
	for rd := mcptest.NewSSEReader(body, 64<<10); ; {
		ev, err := rd.NextRaw()
		switch {
		case err == io.EOF:
			return events, payload, errors.New("stream ended without the JSON-RPC response")
		case err != nil:
			return events, payload, err
		case bytes.HasPrefix(ev.Data, progressPrefix):
			events, payload = events+1, payload+int64(len(ev.Data))
			if onEvent != nil {
				onEvent(ev)
			}
		case bytes.Contains(ev.Data, []byte(`"result"`)):
			return events, payload, nil
		case len(ev.Data) > 0:
			return events, payload, fmt.Errorf("unexpected event %q: %.200s", ev.Type, ev.Data)
		}
	}
}

// call starts a tools/call of the upstream's stream tool.
func call(ctx context.Context, c *mcptest.Client, args mcptest.StreamArgs) (*http.Response, error) {
	return c.Call(ctx, 1, "stream", args, "b")
}

// throughput: Streams concurrent tools/calls, each in its own session, each
// streaming Total/Streams events as fast as the upstream writes them.
func (l *loader) throughput(ctx context.Context, c command) (result, error) {
	per := max(c.Total/c.Streams, 1)
	cs, closeAll, err := l.open(ctx, c.Base, c.Streams)
	defer closeAll()
	if err != nil {
		return result{}, err
	}
	var events, payload atomic.Int64
	cpu0, t0 := l.mark(), time.Now()
	err = mcptest.Parallel(c.Streams, c.Streams, func(i int) error {
		resp, err := call(ctx, cs[i], mcptest.StreamArgs{N: per, Size: c.Size})
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		n, p, err := drain(resp.Body, nil)
		events.Add(n)
		payload.Add(p)
		if err == nil && n != int64(per) {
			err = fmt.Errorf("got %d of %d events", n, per)
		}
		return err
	})
	r := result{Elapsed: time.Since(t0), Events: events.Load(), Payload: payload.Load()}
	r.CPU = l.mark() - cpu0
	return r, err
}

// latency: one stream of paced events carrying their write time; upstream
// write to client read, per event.
func (l *loader) latency(ctx context.Context, c command) (result, error) {
	cs, closeAll, err := l.open(ctx, c.Base, 1)
	defer closeAll()
	if err != nil {
		return result{}, err
	}
	resp, err := call(ctx, cs[0], mcptest.StreamArgs{N: c.Total, Size: c.Size, TS: true, IntervalMS: float64(latencyEvery) / 1e6})
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	lats := make([]float64, 0, c.Total)
	_, _, err = drain(resp.Body, func(ev mcptest.RawEvent) {
		if ts, ok := parseTS(ev.Data); ok {
			lats = append(lats, float64(time.Now().UnixNano()-ts)/1e3)
		}
	})
	if err == nil && len(lats) != c.Total {
		err = fmt.Errorf("%d of %d timestamps", len(lats), c.Total)
	}
	return result{P50: percentile(lats, 50), P99: percentile(lats, 99), Max: percentile(lats, 100)}, err
}

// waitStream polls the admin API until cond holds for a session's stream.
func waitStream(admin, sid string, num uint32, cond func(buffer.StreamInfo) bool) error {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		s, _, err := mcptest.Session(admin, sid)
		if i := slices.IndexFunc(s.Streams, func(st buffer.StreamInfo) bool { return st.Num == num }); err != nil || i >= 0 && cond(s.Streams[i]) {
			return err
		}
	}
	return fmt.Errorf("session %s stream %d: timed out", sid, num)
}

// resume: a client reads 5 events and drops; once the proxy has seen it
// go, the upstream writes the rest into the log (Fill, no client); a GET
// with the last Last-Event-ID then replays them to the end.
func (l *loader) resume(ctx context.Context, c command) (r result, err error) {
	const pre = 5
	cs, closeAll, err := l.open(ctx, c.Base, 1)
	defer closeAll()
	if err != nil {
		return r, err
	}
	token := rand.Text() // the upstream holds the call until released
	l.up.Hold(token)
	defer l.up.Release(token) // idempotent
	resp, err := call(ctx, cs[0], mcptest.StreamArgs{N: c.Total, Size: replaySize, Pre: pre, Hold: token})
	if err != nil {
		return r, err
	}
	evs, err := mcptest.ReadEvents(resp.Body, pre, 10*time.Second)
	resp.Body.Close()
	if err != nil || len(evs) != pre {
		return r, fmt.Errorf("reading the first events: %d, %v", len(evs), err)
	}
	id, err := eventid.Parse(evs[pre-1].ID)
	if err != nil {
		return r, err
	}
	// Release the upstream only once the proxy has seen the client leave,
	// so every further event stays undelivered in the log.
	if err := waitStream(c.Admin, cs[0].SessionID, id.Stream, func(st buffer.StreamInfo) bool { return !st.Connected }); err != nil {
		return r, err
	}
	t0 := time.Now()
	l.up.Release(token)
	if err := waitStream(c.Admin, cs[0].SessionID, id.Stream, func(st buffer.StreamInfo) bool { return st.State != "live" }); err != nil {
		return r, err
	}
	r.Fill = time.Since(t0)
	t1 := time.Now()
	if resp, err = cs[0].Resume(ctx, evs[pre-1].ID); err != nil {
		return r, err
	}
	defer resp.Body.Close()
	r.Events, r.Payload, err = drain(resp.Body, func(mcptest.RawEvent) {
		if r.TTFB == 0 {
			r.TTFB = time.Since(t1)
		}
	})
	if r.Elapsed = time.Since(t1); err == nil && r.Events != int64(c.Total-pre) {
		err = fmt.Errorf("replayed %d of %d events", r.Events, c.Total-pre)
	}
	return r, err
}

// callSize is the JSON-RPC bytes of the one progress notification a short
// call sends before its result (~300 B of SSE in all with the result).
const callSize = 160

// shortCall makes one tools/call answered by a progress notification and
// the result, read to its end.
func shortCall(ctx context.Context, c *mcptest.Client, id int) error {
	// Each call its own id: the same id and body again would be a repeated
	// request, which mcp_resume answers from the first call's retained
	// stream without asking the upstream.
	resp, err := c.Call(ctx, id, "stream", mcptest.StreamArgs{N: 1, Size: callSize}, "b")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	n, _, err := drain(resp.Body, nil)
	if err == nil && n != 1 {
		err = fmt.Errorf("got %d progress notifications, want 1", n)
	}
	return err
}

// calls: Streams sessions, each making short calls back to back, Total
// calls in all; Events is the calls made, P50/P99/Max their latency
// (request sent to result read).
func (l *loader) calls(ctx context.Context, c command) (result, error) {
	cs, closeAll, err := l.open(ctx, c.Base, c.Streams)
	defer closeAll()
	if err != nil {
		return result{}, err
	}
	return l.timed(c, func(i, j int) error { return shortCall(ctx, cs[i], j+2) })
}

// timed runs one(i, j) for j below Total/Streams in each of Streams
// workers i at once, and measures them: Events is how many ran, P50/P99/Max
// their latency, CPU the proxy's.
func (l *loader) timed(c command, one func(i, j int) error) (result, error) {
	per := max(c.Total/c.Streams, 1)
	lats := make([][]float64, c.Streams)
	cpu0, t0 := l.mark(), time.Now()
	err := mcptest.Parallel(c.Streams, c.Streams, func(i int) error {
		lats[i] = make([]float64, 0, per)
		for j := range per {
			start := time.Now()
			if err := one(i, j); err != nil {
				return err
			}
			lats[i] = append(lats[i], float64(time.Since(start).Nanoseconds())/1e3)
		}
		return nil
	})
	r := result{Elapsed: time.Since(t0)}
	r.CPU = l.mark() - cpu0
	all := slices.Concat(lats...)
	r.Events, r.P50, r.P99, r.Max = int64(len(all)), percentile(all, 50), percentile(all, 99), percentile(all, 100)
	return r, err
}

// churn: Streams workers, each running whole sessions back to back (
// initialize, notifications/initialized, one short call, DELETE), Total
// sessions in all; Events is the sessions run, P50/P99/Max their latency.
func (l *loader) churn(ctx context.Context, c command) (result, error) {
	return l.timed(c, func(int, int) error {
		s := mcptest.NewClient(c.Base, protocolVersion, l.hc)
		if err := s.Initialize(ctx); err != nil {
			return err
		}
		if err := shortCall(ctx, s, 1); err != nil {
			return err
		}
		return s.Delete(ctx)
	})
}
