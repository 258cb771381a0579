package mcptest

import (
	"net/http"
	"sync"
	"time"
)

// OneGET is an upstream that allows one GET of a session at a time, as the
// official SDK servers do (the Go SDK answers "stream ID conflicts with
// ongoing stream", the TypeScript one "Only one SSE stream is allowed per
// session", both 409), only stricter: a GET counts as open until its
// handler has returned, which is after the server noticed its client
// closed it. A GET of a session while another is open is answered 409,
// and the time the other took to end from then is kept (Lags): a proxy
// that closed its previous GET first leaves only the server's own delay
// in noticing the close, a few milliseconds.
type OneGET struct {
	Next http.Handler

	mu    sync.Mutex
	open  map[string]int           // GETs being served, by session
	ended map[string]chan struct{} // closed when the session's open GET ends
	gets  int
	lags  []time.Duration
}

func (o *OneGET) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		o.Next.ServeHTTP(w, r)
		return
	}
	sid := r.Header.Get("Mcp-Session-Id")
	o.mu.Lock()
	o.gets++
	if o.open[sid] > 0 {
		ended, began := o.ended[sid], time.Now()
		o.mu.Unlock()
		go func() {
			<-ended
			o.mu.Lock()
			o.lags = append(o.lags, time.Since(began))
			o.mu.Unlock()
		}()
		http.Error(w, "Conflict: only one GET stream per session", http.StatusConflict)
		return
	}
	if o.open == nil {
		o.open, o.ended = make(map[string]int), make(map[string]chan struct{})
	}
	o.open[sid]++
	ended := make(chan struct{})
	o.ended[sid] = ended
	o.mu.Unlock()
	defer func() {
		o.mu.Lock()
		o.open[sid]--
		o.mu.Unlock()
		close(ended)
	}()
	o.Next.ServeHTTP(w, r)
}

// Counts returns the GETs seen and, for each answered 409, how long the
// other GET of its session took to end from then (once it has).
func (o *OneGET) Counts() (gets int, lags []time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.gets, append([]time.Duration(nil), o.lags...)
}

// Open returns the GETs of session sid being served now.
func (o *OneGET) Open(sid string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.open[sid]
}
