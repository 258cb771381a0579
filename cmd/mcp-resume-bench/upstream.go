package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// protocolVersion is what the upstream negotiates: resumable, no priming.
const protocolVersion = "2025-06-18"

// upstream is a minimal MCP server (Streamable HTTP, plain net/http): just
// enough protocol for the benchmark, and as cheap as possible so that the
// proxy's cost dominates what changes between the two setups.
type upstream struct {
	srv  *http.Server
	addr string // host:port

	mu       sync.Mutex
	sessions map[string]struct{}
	holds    map[string]chan struct{}

	flushEach bool // flush after every event (what MCP SDKs do)
	active    atomic.Int64
}

// callArgs are the tools/call arguments of the benchmark's one tool.
type callArgs struct {
	N          int    `json:"n"`           // progress events before the response
	Size       int    `json:"size"`        // JSON bytes of each progress message
	IntervalUS int    `json:"interval_us"` // pacing; 0 = as fast as possible
	TS         bool   `json:"ts"`          // embed a write timestamp
	Pre        int    `json:"pre"`         // with Hold: events written before waiting
	Hold       string `json:"hold"`        // wait for release(Hold) after Pre events
}

func startUpstream(flushEach bool) (*upstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &upstream{
		addr:      ln.Addr().String(),
		sessions:  make(map[string]struct{}),
		holds:     make(map[string]chan struct{}),
		flushEach: flushEach,
	}
	u.srv = &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second}
	go u.srv.Serve(ln)
	return u, nil
}

func (u *upstream) close() { u.srv.Close() }

// hold registers a token a tools/call waits on (after its Pre events) until
// release. Register before sending the request.
func (u *upstream) hold(token string) {
	u.mu.Lock()
	u.holds[token] = make(chan struct{})
	u.mu.Unlock()
}

func (u *upstream) release(token string) {
	u.mu.Lock()
	if ch, ok := u.holds[token]; ok {
		close(ch)
		delete(u.holds, token)
	}
	u.mu.Unlock()
}

func (u *upstream) holdChan(token string) <-chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	if ch, ok := u.holds[token]; ok {
		return ch
	}
	return nil // released already
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodDelete:
		u.mu.Lock()
		delete(u.sessions, r.Header.Get("Mcp-Session-Id"))
		u.mu.Unlock()
		w.WriteHeader(http.StatusOK)
		return
	case http.MethodPost:
	default:
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Arguments callArgs `json:"arguments"`
		} `json:"params"`
	}
	if err := json.Unmarshal(body, &msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	switch {
	case msg.Method == "initialize":
		var b [16]byte
		rand.Read(b[:])
		sid := hex.EncodeToString(b[:])
		u.mu.Lock()
		u.sessions[sid] = struct{}{}
		u.mu.Unlock()
		w.Header().Set("Mcp-Session-Id", sid)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(msg.ID) + `,"result":{"protocolVersion":"` + protocolVersion +
			`","capabilities":{"tools":{}},"serverInfo":{"name":"mcp-resume-bench","version":"1"}}}`))
	case len(msg.ID) == 0:
		w.WriteHeader(http.StatusAccepted) // a notification
	case msg.Method == "tools/call":
		u.active.Add(1)
		defer u.active.Add(-1)
		u.stream(w, r, msg.ID, msg.Params.Arguments)
	default:
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(msg.ID) + `,"result":{}}`))
	}
}

// stream answers a tools/call with an SSE stream of progress notifications
// and then the JSON-RPC response.
func (u *upstream) stream(w http.ResponseWriter, r *http.Request, id json.RawMessage, a callArgs) {
	fl := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	fl.Flush()
	buf := make([]byte, 0, a.Size+256)
	interval := time.Duration(a.IntervalUS) * time.Microsecond
	start := time.Now()
	wait := func() bool {
		ch := u.holdChan(a.Hold)
		if ch == nil {
			return true
		}
		t := time.NewTimer(time.Minute)
		defer t.Stop()
		select {
		case <-ch:
			return true
		case <-r.Context().Done():
			return false
		case <-t.C:
			return false
		}
	}
	if a.Hold != "" && a.Pre == 0 && !wait() {
		return
	}
	for i := 1; i <= a.N; i++ {
		if interval > 0 {
			if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
				time.Sleep(d)
			}
		}
		var ts int64
		if a.TS {
			ts = time.Now().UnixNano()
		}
		buf, _ = appendProgress(buf[:0], i, ts, a.Size)
		if _, err := w.Write(buf); err != nil {
			return
		}
		if u.flushEach || interval > 0 || i == a.Pre {
			fl.Flush()
		}
		if a.Hold != "" && i == a.Pre && !wait() {
			return
		}
	}
	buf = append(buf[:0], eventPrefix...)
	buf = append(buf, `{"jsonrpc":"2.0","id":`...)
	buf = append(buf, id...)
	buf = append(buf, `,"result":{"content":[{"type":"text","text":"sent `...)
	buf = strconv.AppendInt(buf, int64(a.N), 10)
	buf = append(buf, ` events"}]}}`...)
	buf = append(buf, eventSuffix...)
	w.Write(buf)
	fl.Flush()
}
