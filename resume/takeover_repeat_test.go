package resume

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
)

// tailStream is a takeoverStream that says what its last events were, as
// a shared store's streams do (buffer.UpstreamTail).
type tailStream struct {
	takeoverStream
	tail []buffer.TailEvent
}

func (s tailStream) UpstreamTail(_ context.Context, n int, each func(buffer.TailEvent)) error {
	for _, e := range s.tail[max(0, len(s.tail)-n):] {
		each(e)
	}
	return nil
}

// readToEnd reads what the client of stream str gets, to its end.
func readToEnd(t *testing.T, str buffer.Stream) []sseEvent {
	t.Helper()
	rd, err := str.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	var body strings.Builder
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, err := rd.Read(context.Background(), nil, 1<<20, time.Second)
		for _, d := range b.Data {
			body.Write(d)
		}
		switch {
		case errors.Is(err, io.EOF):
			return events(t, body.String())
		case err != nil && !errors.Is(err, buffer.ErrIdle):
			t.Fatalf("read: %v after %q", err, body.String())
		case time.Now().After(deadline):
			t.Fatalf("the stream did not end: %q", body.String())
		}
	}
}

// A takeover's upstream replay resends the events at and before the
// cursor (same IDs, same content): the stream has them (the store says
// so: UpstreamTail), so they are dropped; one that reuses the cursor's ID
// with other content is new, and delivered (policy.UpstreamRepeat), as is
// one that reuses an ID the store no longer names.
func TestTakeoverDropsWhatTheReplayRepeats(t *testing.T) {
	h := testHandler(t)
	sess := newSession(t, h, "2025-11-25")
	str, err := sess.NewStream([]string{`1`}, [32]byte{})
	if err != nil {
		t.Fatal(err)
	}
	var tail []buffer.TailEvent
	for i, id := range []string{"u1", "u2"} {
		// Stored as the tap stores the upstream's event: without its id.
		fields := []byte(strings.TrimSuffix(progress("", i+1), "\n"))
		seq, err := str.Append(context.Background(), buffer.Entry{Fields: fields, Upstream: id})
		if err != nil {
			t.Fatal(err)
		}
		tail = append(tail, buffer.TailEvent{Seq: seq, ID: id, Sum: buffer.FieldsSum(fields)})
	}
	up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{
		sseStep("eof", "id: u0\ndata: \n\n", // a priming event before them: passed, as ever
			progress("u1", 1), "event: message\nid: u2\nretry: 50\ndata: "+
				fmt.Sprintf(`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":%d}}`, 2)+"\n\n", // not as stored: framed anew
			progress("u2", 3), // the cursor's ID, other content
			result("u3", "1")),
	}}
	if !h.takeOver(post("1"), up, sess, tailStream{takeoverStream{str}, tail}) {
		t.Fatal("not taken over")
	}
	evs := readToEnd(t, str)
	waitFor(t, 5*time.Second, "the upstream asked", func() bool { return len(up.requests()) == 1 })
	if got := up.requests()[0].Header.Get(hdrLastEventID); got != "u2" {
		t.Fatalf("the takeover asked from %q, want u2", got)
	}
	checkContiguous(t, evs)
	var got []string
	for _, ev := range evs {
		got = append(got, ev.Data)
	}
	want := []string{`"progress":1}`, `"progress":2}`, `"progress":3}`, `"result"`}
	if len(evs) != len(want) {
		t.Fatalf("the client got %d events, want %d: %q", len(evs), len(want), got)
	}
	for i, w := range want {
		if !strings.Contains(evs[i].Data, w) {
			t.Fatalf("event %d is %q, want %s: %q", i+1, evs[i].Data, w, got)
		}
	}
}

// Without what the stream holds (a store without UpstreamTail), the
// replay's repeats reach the client: the control for the test above.
func TestTakeoverWithoutTheTailTakesTheReplay(t *testing.T) {
	h := testHandler(t)
	sess := newSession(t, h, "2025-11-25")
	str, err := sess.NewStream([]string{`1`}, [32]byte{})
	if err != nil {
		t.Fatal(err)
	}
	fields := []byte(strings.TrimSuffix(progress("", 1), "\n"))
	if _, err := str.Append(context.Background(), buffer.Entry{Fields: fields, Upstream: "u1"}); err != nil {
		t.Fatal(err)
	}
	up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{
		sseStep("eof", progress("u1", 1), result("u2", "1")),
	}}
	if !h.takeOver(post("1"), up, sess, takeoverStream{str}) {
		t.Fatal("not taken over")
	}
	if evs := readToEnd(t, str); len(evs) != 3 {
		t.Fatalf("the client got %d events, want 3 (the repeat too): %+v", len(evs), evs)
	}
}
