package natsstore

import (
	"context"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// A call's end whose acknowledgement is lost with its connection: the
// update waited out its whole 10 s context before it was tried again, and
// the call's clients saw its end that late. Its attempt ends with the
// connection now, and the write it finds stored is its own.
func TestALostEndAcknowledgementDelaysNoCall(t *testing.T) {
	t.Parallel()
	a, cut := cutLeasesTTL(t, 21*time.Second)
	sa, err := a.CreateSession("sess", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str, p, rd, err := sa.(buffer.CallOpener).OpenCall(context.Background(), []string{"1"}, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	rd.Close()
	key := str.(*stream).key
	if _, err := str.Append(context.Background(), buffer.Entry{Fields: []byte("data: r\n"), Answers: []string{"1"}}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the result stored", 5*time.Second, func() bool { r, ok := str.(*stream).record(); return ok && r.Head == 1 })
	cut.arm("HPUB $KV."+a.names.streams+"."+key+" ", `"ended":`)
	began := time.Now()
	str.Complete()
	p.Done()
	waitUntil(t, "the call's end", 10*time.Second, func() bool { return str.View().State != policy.Live })
	took := time.Since(began)
	if !cut.fired.Load() {
		t.Fatal("the cutter did not fire")
	}
	if took > 2*time.Second {
		t.Fatalf("the call's end took %v to be known after its write's acknowledgement was lost", took.Round(10*time.Millisecond))
	}
	rec, _, err := a.streams.lookupErr(context.Background(), key)
	if err != nil || rec.State != policy.Complete {
		t.Fatalf("the record after the end: %+v %v", rec, err)
	}
}

// A session's stream number written, its acknowledgement lost: made again,
// the change would apply twice and skip a number (a client's cursor on
// the skipped one is answered as a gap, not the 400 it is owed). The
// attempt finds its own tagged write stored, and the next call gets the
// next number.
func TestALostNumberAcknowledgementSkipsNoNumber(t *testing.T) {
	t.Parallel()
	a, cut := cutLeasesTTL(t, 21*time.Second)
	sa, err := a.CreateSession("sess", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	s := sa.(*session)
	cut.arm("HPUB $KV."+a.names.sessions+"."+s.sh+" ", `"next"`)
	began := time.Now()
	first, err := sa.NewStream([]string{"1"}, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	if !cut.fired.Load() {
		t.Fatal("the cutter did not fire")
	}
	second, err := sa.NewStream([]string{"2"}, [32]byte{2})
	if err != nil {
		t.Fatal(err)
	}
	if n1, n2 := first.(*stream).num, second.(*stream).num; n1 != 1 || n2 != 2 {
		t.Fatalf("the session's first streams are %d and %d, not 1 and 2: a number was skipped "+
			"(the first write's acknowledgement was lost)", n1, n2)
	}
	if took > 2*time.Second {
		t.Fatalf("the call took %v to open after its number's acknowledgement was lost", took.Round(10*time.Millisecond))
	}
}
