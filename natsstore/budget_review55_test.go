package natsstore

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Review 55: an append blocked on max_total_bytes goes on promptly once a
// session's end frees the room, whether that session ended on the
// append's replica (a purge there bumps the generation, the total is not
// invalidated) or on another one sharing the NATS server.
func TestReview55ABlockedAppendGoesOnOnceAPurgeFreesTheTotal(t *testing.T) {
	for _, where := range []string{"same replica", "other replica"} {
		t.Run(where, func(t *testing.T) {
			stalled := make(chan struct{}, 16)
			a, b := replicas(t, func(o *Options) {
				o.Limits.MaxTotalBytes = 2 << 20
				o.Limits.MaxStreamBytes, o.Limits.MaxSessionBytes = 2<<20, 2<<20
				o.Limits.StallTimeout = 30 * time.Second
				o.Hooks.StallStarted = func(string, uint32) {
					select {
					case stalled <- struct{}{}:
					default:
					}
				}
			})
			host := a
			if where == "other replica" {
				host = b
			}
			ev := buffer.Entry{Fields: append(append([]byte("data: "), bytes.Repeat([]byte("x"), 16<<10)...), '\n')}
			fill := func(st *Store, id string, n int) buffer.Stream {
				_, str, _ := callIn(t, st, id)
				for i := 0; i < n; i++ {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					_, err := str.Append(ctx, ev)
					cancel()
					if err != nil {
						t.Fatalf("filling %s: append %d: %v", id, i, err)
					}
				}
				return str
			}
			fill(host, "filler", 64) // 1 MiB, no client: up to 1.5 MiB for streams without one
			str := fill(a, "blocked", 0)
			done := make(chan error, 1)
			go func() {
				for {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					_, err := str.Append(ctx, ev)
					cancel()
					if err != nil {
						done <- err
						return
					}
					select {
					case <-stalled:
						// The next one goes in once room is freed.
						ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
						_, err := str.Append(ctx, ev)
						cancel()
						done <- err
						return
					default:
					}
				}
			}()
			select {
			case <-stalled:
				stalled <- struct{}{} // for the appender
			case err := <-done:
				t.Fatalf("the appends never blocked: %v", err)
			case <-time.After(20 * time.Second):
				t.Fatal("the appends never blocked")
			}
			time.Sleep(500 * time.Millisecond) // blocked a while: its reading is fresh, then older
			began := time.Now()
			if !host.Delete("filler", policy.ReasonDeleted) {
				t.Fatal("filler not deleted")
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("the blocked append failed: %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("the blocked append still waits 15 s after the room was freed")
			}
			took := time.Since(began)
			t.Logf("%s: the blocked append went on %v after the delete", where, took)
			if took > 2*time.Second {
				t.Fatalf("%s: the blocked append went on %v after the room was freed", where, took)
			}
		})
	}
}
