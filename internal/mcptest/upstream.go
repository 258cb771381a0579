package mcptest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Upstream is a minimal MCP server (Streamable HTTP) on plain net/http, as
// cheap as can be so that what a test or the benchmark sees is the proxy:
// initialize opens a session, notifications get 202, DELETE 200, requests
// other than tools/call an empty result, and tools/call streams progress
// notifications as its StreamArgs ask, then the result. Tools scripts the
// answer to a tool by name instead: malformed SSE, a server of another
// protocol version, whatever a test needs.
type Upstream struct {
	// Version is the protocol version initialize answers; "" echoes the
	// client's.
	Version string
	// FlushEach flushes after every progress event, as MCP SDKs do. Without
	// it a stream is flushed when the response buffer fills, when it is
	// paced, and before a hold.
	FlushEach bool
	// KeepCalls remembers each session's latest streamed tools/call, for
	// LastCall. Off by default: the benchmark measures memory per session.
	KeepCalls bool
	// Tools answers tools/call of these names in full, instead of streaming.
	Tools map[string]Tool

	sessions atomic.Int64
	active   atomic.Int64
	mu       sync.Mutex
	holds    map[string]chan struct{}
	calls    map[string]*Call // by session id, with KeepCalls
}

// Tool writes the whole answer to a tools/call, headers included.
type Tool func(w http.ResponseWriter, r *http.Request, req *Request)

// Request is a JSON-RPC message as the upstream reads it.
type Request struct {
	ID     json.RawMessage `json:"id"` // none: a notification
	Method string          `json:"method"`
	Params struct {
		ProtocolVersion string          `json:"protocolVersion"` // of initialize
		Name            string          `json:"name"`            // of tools/call
		Arguments       json.RawMessage `json:"arguments"`
		Meta            struct {
			ProgressToken json.RawMessage `json:"progressToken"`
		} `json:"_meta"`
	} `json:"params"`
}

// StreamArgs are the arguments of a streamed tools/call.
type StreamArgs struct {
	N          int     `json:"n"`                     // progress events before the result
	Size       int     `json:"size,omitempty"`        // JSON bytes of each progress message, padded (0: unpadded)
	IntervalMS float64 `json:"interval_ms,omitempty"` // pacing (0: as fast as the connection takes them)
	TS         bool    `json:"ts,omitempty"`          // embed the write time as "ts" (unix nanoseconds)
	Hold       string  `json:"hold,omitempty"`        // wait for Release(Hold) after Pre events
	Pre        int     `json:"pre,omitempty"`
}

// Call is one streamed tools/call, as far as the upstream got with it.
type Call struct {
	Args     StreamArgs
	Written  atomic.Int64  // bytes of progress events written (and flushed, with FlushEach)
	Events   atomic.Int64  // progress events written
	Finished atomic.Bool   // the result was written and flushed
	Done     chan struct{} // closed when the handler returns
}

// Active is the number of tools/call streams being written.
func (u *Upstream) Active() int64 { return u.active.Load() }

// LastCall returns the latest streamed tools/call of a session (KeepCalls),
// nil before it arrived.
func (u *Upstream) LastCall(sessionID string) *Call {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[sessionID]
}

// Hold makes a tools/call with StreamArgs.Hold token wait (after its Pre
// events) until Release. Call it before sending the request.
func (u *Upstream) Hold(token string) {
	u.mu.Lock()
	if u.holds == nil {
		u.holds = map[string]chan struct{}{}
	}
	u.holds[token] = make(chan struct{})
	u.mu.Unlock()
}

// Release lets the calls held on token go on.
func (u *Upstream) Release(token string) {
	u.mu.Lock()
	if ch, ok := u.holds[token]; ok {
		close(ch)
		delete(u.holds, token)
	}
	u.mu.Unlock()
}

// wait waits for Release(token), up to a minute; false if the request ended
// first.
func (u *Upstream) wait(r *http.Request, token string) bool {
	u.mu.Lock()
	ch := u.holds[token]
	u.mu.Unlock()
	if ch == nil {
		return true // released already
	}
	t := time.NewTimer(time.Minute)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-r.Context().Done():
	case <-t.C:
	}
	return false
}

func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodPost:
	case http.MethodDelete:
		w.WriteHeader(http.StatusOK)
		return
	default:
		http.Error(w, "no standalone stream here", http.StatusMethodNotAllowed)
		return
	}
	req := new(Request)
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	switch {
	case req.Method == "tools/call" && u.Tools[req.Params.Name] != nil:
		u.Tools[req.Params.Name](w, r, req)
	case len(req.ID) == 0:
		w.WriteHeader(http.StatusAccepted) // a notification
	case req.Method == "initialize":
		version := u.Version
		if version == "" {
			version = req.Params.ProtocolVersion
		}
		w.Header().Set("Mcp-Session-Id", fmt.Sprintf("mcptest-%d", u.sessions.Add(1)))
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":%q,"capabilities":{"tools":{}},"serverInfo":{"name":"mcptest","version":"1"}}}`, req.ID, version)
	case req.Method == "tools/call":
		var a StreamArgs
		if err := json.Unmarshal(req.Params.Arguments, &a); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		u.stream(w, r, req, a)
	default:
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{}}`, req.ID)
	}
}

// stream answers a tools/call with an SSE stream of progress notifications
// and then the result.
func (u *Upstream) stream(w http.ResponseWriter, r *http.Request, req *Request, a StreamArgs) {
	c := &Call{Args: a, Done: make(chan struct{})}
	defer close(c.Done)
	if u.KeepCalls {
		u.mu.Lock()
		if u.calls == nil {
			u.calls = map[string]*Call{}
		}
		u.calls[r.Header.Get("Mcp-Session-Id")] = c
		u.mu.Unlock()
	}
	u.active.Add(1)
	defer u.active.Add(-1)

	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if rc.Flush() != nil {
		return
	}
	if a.Hold != "" && a.Pre == 0 && !u.wait(r, a.Hold) {
		return
	}
	interval := time.Duration(a.IntervalMS * float64(time.Millisecond))
	start := time.Now()
	buf := make([]byte, 0, a.Size+256)
	for i := 1; i <= a.N; i++ {
		if interval > 0 {
			time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
		}
		var ts int64
		if a.TS {
			ts = time.Now().UnixNano()
		}
		buf = AppendProgress(buf[:0], req.Params.Meta.ProgressToken, i, ts, a.Size)
		if _, err := w.Write(buf); err != nil {
			return
		}
		if (u.FlushEach || interval > 0 || i == a.Pre) && rc.Flush() != nil {
			return
		}
		c.Written.Add(int64(len(buf)))
		c.Events.Add(1)
		if a.Hold != "" && i == a.Pre && !u.wait(r, a.Hold) {
			return
		}
	}
	buf = fmt.Appendf(buf[:0], "%s{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"streamed %d events\"}]}}%s",
		EventPrefix, req.ID, a.N, EventSuffix)
	if _, err := w.Write(buf); err == nil && rc.Flush() == nil {
		c.Finished.Store(true)
	}
}

// EventPrefix and EventSuffix frame every event the Upstream writes: the
// SSE framing adds 23 bytes to a message.
const (
	EventPrefix = "event: message\ndata: "
	EventSuffix = "\n\n"
)

// AppendProgress appends an SSE event carrying a notifications/progress
// message whose JSON is size bytes long when size allows: padded with a
// "message" string, or with JSON white space where even an empty "message"
// field would not fit (a bare message is about 100 bytes, and longer than a
// small size). ts > 0 is embedded as "ts" (unix nanoseconds), to measure
// latency.
func AppendProgress(dst []byte, token json.RawMessage, progress int, ts int64, size int) []byte {
	if len(token) == 0 {
		token = json.RawMessage("null")
	}
	dst = append(dst, EventPrefix...)
	start := len(dst)
	dst = append(dst, `{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":`...)
	dst = append(dst, token...)
	dst = append(dst, `,"progress":`...)
	dst = strconv.AppendInt(dst, int64(progress), 10)
	if ts > 0 {
		dst = append(dst, `,"ts":`...)
		dst = strconv.AppendInt(dst, ts, 10)
	}
	const msgField, closing = `,"message":""`, `}}`
	if pad := size - (len(dst) - start) - len(closing); pad >= len(msgField) {
		dst = append(dst, `,"message":"`...)
		dst = appendRepeat(dst, 'x', pad-len(msgField))
		dst = append(dst, '"')
	} else if pad > 0 {
		dst = appendRepeat(dst, ' ', pad)
	}
	dst = append(dst, closing...)
	return append(dst, EventSuffix...)
}

// appendRepeat appends n copies of b, doubling what it copies each time.
func appendRepeat(dst []byte, b byte, n int) []byte {
	start := len(dst)
	dst = slices.Grow(dst, n)[:start+n]
	if n > 0 {
		dst[start] = b
	}
	for k := 1; k < n; k *= 2 {
		copy(dst[start+k:], dst[start:start+k])
	}
	return dst
}
