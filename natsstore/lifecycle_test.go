package natsstore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// What survives a replica: a restart, a crash, a Close.

// A restart (the store and its embedded server closed, opened again on the
// same directory) keeps sessions, tombstones, retained events and the
// zone secret.
func TestRestartKeepsTheZone(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	st := openEmbedded(t, testLimits(), func(o *Options) { o.Dir = dir })
	key := append([]byte(nil), st.Key()...)
	s, _ := st.CreateSession("kept", buffer.SessionMeta{Version: "2025-11-25", Bind: []string{"Authorization"}})
	str, _ := s.NewStream([]string{"7"}, [32]byte{7})
	appendEvents(t, str, 1, 5)
	str.Complete()
	g := s.Standalone()
	p := claim(t, g)
	appendEvents(t, g, 1, 2)
	g.NoteUpstream("up-2") // recorded as the producer lets go
	p.Done()
	gone, _ := st.CreateSession("gone", buffer.SessionMeta{})
	gone.NewStream([]string{"1"}, [32]byte{1})
	st.Delete("gone", policy.ReasonPurged)
	epoch := s.Epoch()
	st.Close()

	st2 := openEmbedded(t, testLimits(), func(o *Options) { o.Dir = dir })
	if !bytes.Equal(st2.Key(), key) {
		t.Fatal("the zone secret changed")
	}
	s2, ok := st2.Session("kept")
	if !ok || s2.Epoch() != epoch || s2.Meta().Version != "2025-11-25" || s2.NextStream() != 2 {
		t.Fatalf("session after restart: %v %+v", ok, s2)
	}
	if tomb, ok := st2.Tombstone("gone"); !ok || tomb.Reason != policy.ReasonPurged || len(tomb.Streams) != 1 {
		t.Fatalf("tombstone after restart: %+v %v", tomb, ok)
	}
	str2, ok := s2.Stream(1)
	if !ok || str2.View().State != policy.Complete || str2.View().Head != 5 {
		t.Fatalf("stream after restart: %v %+v", ok, str2.View())
	}
	r, _ := str2.Attach(1)
	defer r.Close()
	seqs, err := readSeqs(t, r, epoch, 1, 1, 100)
	if err != io.EOF {
		t.Fatalf("end: %v", err)
	}
	checkRun(t, seqs, 1, 5)
	g2 := s2.Standalone()
	if g2.UpstreamCursor() != "up-2" || g2.View().Head != 2 {
		t.Fatalf("standalone after restart: %q %+v", g2.UpstreamCursor(), g2.View())
	}
	p2 := tryClaim(g2)
	if p2 == nil {
		t.Fatal("the standalone stream's lease outlived the restart")
	}
	appendEvents(t, g2, 3, 4)
	rg, _ := g2.Attach(1)
	defer rg.Close()
	seqs, err = readSeqs(t, rg, epoch, 0, 1, 4)
	if err != nil {
		t.Fatal(err)
	}
	checkRun(t, seqs, 1, 4)
	p2.Done()
}

// A producer that disappears (its replica killed) leaves its request
// stream live with no lease: the sweeper elsewhere fails it with the
// failure signals and the end marker, and a reader on B ends with
// FailedError(upstream_failed) after them.
func TestDeadProducerFailedBySweeper(t *testing.T) {
	t.Parallel()
	a, b := replicas(t, func(o *Options) { o.LeaseTTL = time.Second })
	sa, _ := a.CreateSession("sess", buffer.SessionMeta{})
	str, _ := sa.NewStream([]string{"1", `"two"`}, [32]byte{1})
	claim(t, str)
	appendEvents(t, str, 1, 3)
	if _, err := str.Append(context.Background(), buffer.Entry{Fields: []byte("data: event 4\n"), Answers: []string{"1"}}); err != nil {
		t.Fatal(err)
	}
	str.(*stream).currentWriter().waitStored(10 * time.Second)
	sb := sessionOn(t, b, "sess")
	stB, _ := sb.Stream(1)
	rb, _ := stB.Attach(1)
	defer rb.Close()
	if _, err := readSeqs(t, rb, sb.Epoch(), 1, 1, 4); err != nil {
		t.Fatal(err)
	}
	crash(a)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var signals []byte
	var err error
	for {
		var batch buffer.Batch
		batch, err = rb.Read(ctx, nil, 1<<20, time.Hour)
		for _, d := range batch.Data {
			signals = append(signals, d...)
		}
		if errors.Is(err, buffer.ErrProducerGone) {
			// Told if it looked before the sweeper's signals came: its
			// replica may take over (this stream has no upstream cursor).
			continue
		}
		if err != nil {
			break
		}
	}
	var fe *buffer.FailedError
	if !errors.As(err, &fe) || fe.Reason != policy.ReasonUpstreamFailed {
		t.Fatalf("B's reader ended with %v", err)
	}
	text := string(signals)
	gapID := eventid.ID{Epoch: sb.Epoch(), Stream: 1, Seq: 5}.String()
	lastID := eventid.ID{Epoch: sb.Epoch(), Stream: 1, Seq: 4}.String()
	if !strings.HasPrefix(text, "id: "+gapID+"\nevent: gap\ndata: {\"lastEventId\":\""+lastID+"\",\"lost\":-1,\"reason\":\"upstream_failed\"}\n\n") {
		t.Fatalf("signals %q", text)
	}
	if !strings.Contains(text, `"id":"two","error":{"code":-32010`) || strings.Contains(text, `"id":1,`) {
		t.Fatalf("the pending request must get an error, the answered one none: %q", text)
	}
	v := stB.View()
	if v.State != policy.Failed || v.Head != 6 || v.Requests[0].AnsweredAt != 4 || v.Requests[1].AnsweredAt != 6 {
		t.Fatalf("view after the sweeper: %+v", v)
	}
	if n := b.Counters().FailedStreams()[policy.ReasonUpstreamFailed]; n != 1 {
		t.Fatalf("B's FailedStreams[upstream_failed] = %d", n)
	}
}

// Close releases what the replica held: its producer leases (another
// replica may produce), its consumers, its readers' entries; and the
// live request streams it produced fail loudly, where any replica sees.
func TestCloseReleases(t *testing.T) {
	t.Parallel()
	a, b := replicas(t)
	sa, _ := a.CreateSession("sess", buffer.SessionMeta{})
	g := sa.Standalone()
	claim(t, g)
	appendEvents(t, g, 1, 2)
	str, _ := sa.NewStream([]string{"1"}, [32]byte{1})
	claim(t, str)
	appendEvents(t, str, 1, 2)
	r, _ := str.Attach(1)
	if _, err := readSeqs(t, r, sa.Epoch(), 1, 1, 2); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if info, _ := b.events.Info(ctx); info.State.Consumers != 1 {
		t.Fatalf("%d consumers while A reads", info.State.Consumers)
	}
	a.Close()
	select {
	case <-r.Done():
	default:
		t.Fatal("A's reader goes on after Close")
	}
	sb, ok := b.Session("sess")
	if !ok {
		t.Fatal("the session went with A")
	}
	pb := tryClaim(sb.Standalone())
	if pb == nil {
		t.Fatal("A's standalone lease outlived its Close")
	}
	pb.Done()
	stB, _ := sb.Stream(1)
	waitUntil(t, "the records to settle", 10*time.Second, func() bool {
		v := stB.View() // 1..2, then the gap event and the error for request 1
		return !stB.Connected() && v.State == policy.Failed && v.Head == 4 && v.Requests[0].AnsweredAt == 4
	})
	waitUntil(t, "A's consumer to go", 10*time.Second, func() bool {
		info, err := b.events.Info(ctx)
		return err == nil && info.State.Consumers == 0
	})
}
