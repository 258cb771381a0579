package shared

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
)

// TestSDKResumeCutBeforeItsFirstEventResumesAgain with a call whose events
// are a second apart, as long tool calls are: a 2025-06-18 resume at head
// got its headers with a keep-alive comment after a 250 ms hold (review
// 54), and a cut after that comment, still before the resume's first
// event, left the Go SDK a stream with no ID in it. Its headers now wait
// for that event, however long.
func TestReview54SDKResumeCutAfterTheHoldResumesAgain(t *testing.T) {
	for _, version := range []string{"2025-11-25", "2025-06-18"} {
		t.Run(version, func(t *testing.T) {
			t.Parallel()
			d := deployTakeover(t, 2, "")
			d.lb.SetTarget(d.replicas[0].addr(), d.replicas[1].addr())
			var cutOnce atomic.Bool
			wrap := func(next http.RoundTripper) http.RoundTripper {
				return mcptest.RoundTripFunc(func(r *http.Request) (*http.Response, error) {
					resp, err := next.RoundTrip(r)
					id := r.Header.Get("Last-Event-ID")
					if err == nil && r.Method == http.MethodGet && resp.StatusCode == http.StatusOK &&
						len(strings.Split(id, "-")) == 3 && strings.Split(id, "-")[1] != "0" && cutOnce.CompareAndSwap(false, true) {
						b := &cutAfterPreamble{rc: resp.Body}
						resp.Body = b
						t.Cleanup(func() { t.Logf("the cut resume (Last-Event-ID %s) got %q", id, b.seen) })
					}
					return resp, err
				})
			}
			ct := mcptest.NewCuttableTransport(0)
			ct.DisableKeepAlives = true
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := mcptest.ConnectSDKVia(ctx, "http://"+d.lb.Addr()+"/mcp", version, 12, ct, wrap)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Session.Close() })
			countThrough(t, c, 4, 1000, c.CutAfter(1, false))
			if !cutOnce.Load() {
				t.Fatal("no resume of the call was cut")
			}
		})
	}
}
