package natsstore

import (
	"context"
	"errors"
	"fmt"
	"github.com/nats-io/nats.go/jetstream"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Review 45 (mended; older than this work; end to end:
// TestNATSBlipWhileTheClientResumesElsewhere in tests/shared): a call's
// producer on A appends while A is cut off from NATS for 1 s (well within
// the lease's TTL); the call's client comes back on B during the cut
// (Last-Event-ID 2: everything stored) and follows the stream live there.
// B's resume acknowledges 1..2 and purges them: the subject is empty. Once
// A is back, its writer's next publish (expecting its last message) finds
// the wrong last sequence and no message at all, and A's mirror has not
// seen the record's new floor yet (emptied() false): "another writer
// stored to the stream", the writer fails, what A appended during the cut
// is counted as evicted before acknowledgement (Caddy logs "BUG: event
// evicted while a client could still ask for it") and the call fails
// (upstream_failed) though its upstream was fine. Without B's resume the
// same cut is harmless (the control subtest). The floor moves in the
// record before the purge: emptied() now reads KV where the mirror lags.
func TestReview45WriterSurvivesABlipWithAReaderOnB(t *testing.T) {
	for _, resumeOnB := range []bool{true, false} {
		t.Run(fmt.Sprintf("resume on B %v", resumeOnB), func(t *testing.T) { writerThroughABlip(t, resumeOnB) })
	}
}

func writerThroughABlip(t *testing.T, resumeOnB bool) {
	var faults faultNotes
	note := faults.note
	ns := testnet.NATS(t)
	link := newCutter(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	mod := func(o *Options) {
		o.LeaseTTL = 2 * time.Second
		o.TakeoverWait = 5 * time.Second
	}
	a := openAt(t, []string{"nats://" + link.addr()}, mod, func(o *Options) {
		o.OnError = func(op string, err error) { note(fmt.Sprintf("A %s: %v", op, err)) }
		o.Hooks.EvictedBeforeAck = func(_ string, _ uint32, seq, n uint64) { note(fmt.Sprintf("A EVICTED BEFORE ACK %d+%d", seq, n)) }
	})
	b := openAt(t, []string{ns.ClientURL()}, mod)
	_, str, p := callOn(t, a)
	defer p.Done()
	appendEvents(t, str, 1, 2)
	sb := sessionOn(t, b, "sess")
	stB, ok := sb.Stream(str.Num())
	if !ok {
		t.Fatal("B does not know the stream")
	}
	waitUntil(t, "B to see the head", 10*time.Second, func() bool { return stB.View().Head == 2 })

	link.cut()
	cutAt := time.Now()
	appended := make(chan error, 1)
	go func() {
		for seq := uint64(3); seq <= 8; seq++ {
			time.Sleep(300 * time.Millisecond)
			got, err := str.Append(context.Background(), buffer.Entry{Fields: []byte(fmt.Sprintf("data: event %d\n", seq))})
			if err != nil || got != seq {
				appended <- fmt.Errorf("append %d at %v into the cut: %d %v", seq, time.Since(cutAt).Round(time.Millisecond), got, err)
				return
			}
		}
		appended <- nil
	}()
	time.Sleep(900 * time.Millisecond)
	if !resumeOnB {
		time.Sleep(cutAt.Add(time.Second).Sub(time.Now()))
		link.mend()
		aerr := <-appended
		if aerr != nil || a.counters.EventsEvictedBeforeAck.Load() != 0 {
			t.Fatalf("FAULT: a 1 s cut of A from NATS, no reader anywhere: A's appends: %v; A counted %d events evicted before acknowledgement; writer error %v; A's faults: %q",
				aerr, a.counters.EventsEvictedBeforeAck.Load(), writerErr(str), faults.list())
		}
		return
	}
	in := policy.ResumeInput{SessionHeader: true,
		Session: policy.SessionView{Known: true, Epoch: sb.Epoch(), NextStream: sb.NextStream()},
		Cursor:  policy.Cursor{Valid: true, Minted: true, Epoch: sb.Epoch(), Stream: str.Num(), Seq: 2}}
	d, r, err := stB.Resume(2, func(v policy.StreamView) policy.Resume { in.Stream = &v; return policy.DecideResume(in) })
	if err != nil || r == nil {
		t.Fatalf("resume on B: %+v %v", d, err)
	}
	defer r.Close()
	t.Logf("B resumed (%v) %v into the cut", d.Kind, time.Since(cutAt).Round(time.Millisecond))
	time.Sleep(cutAt.Add(time.Second).Sub(time.Now()))
	link.mend()
	aerr := <-appended
	if aerr != nil || a.counters.EventsEvictedBeforeAck.Load() != 0 {
		t.Logf("the events stream holds: %v", subjectMsgs(b, str.(*stream).subject))
		ra, _ := str.(*stream).record()
		rb, _ := stB.(*stream).record()
		t.Logf("the stream's floor as A's mirror has it: %d; as B's: %d", ra.Floor, rb.Floor)
		t.Fatalf("FAULT: a 1 s cut of A from NATS, the call's client back on B during it: A's appends: %v; "+
			"A counted %d events evicted before acknowledgement; writer error %v; A's faults: %q",
			aerr, a.counters.EventsEvictedBeforeAck.Load(), writerErr(str), faults.list())
	}
	seqs, rerr := readSeqs(t, r, sb.Epoch(), str.Num(), 3, 6)
	if rerr != nil || len(seqs) != 6 {
		t.Fatalf("FAULT: B read %v then %v", seqs, rerr)
	}
}

// writerErr is the error that stopped str's writer on this replica.
func writerErr(str buffer.Stream) any {
	w := str.(*stream).currentWriter()
	if w == nil {
		return "no writer"
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return fmt.Sprintf("err=%v stopErr=%v superseded=%v head=%d stored=%d lastMsg=%d", w.err, w.stopErr, w.superseded, w.head, w.stored, w.lastMsg)
}

// subjectMsgs lists what the events stream holds on subject, as st reads it.
func subjectMsgs(st *Store, subject string) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out []string
	info, err := st.events.Info(ctx)
	if err != nil {
		return []string{err.Error()}
	}
	out = append(out, fmt.Sprintf("stream %d..%d", info.State.FirstSeq, info.State.LastSeq))
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := st.events.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			out = append(out, fmt.Sprintf("%d: %v", seq, err))
			break
		}
		out = append(out, fmt.Sprintf("%d %s (ours %v): %v %q", seq, m.Subject, m.Subject == subject, m.Header, m.Data))
	}
	return out
}
