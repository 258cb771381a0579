package buffer_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/buffer/storetest"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// streamPayload is deterministic per (stream, seq) and varies in length, so a
// reader can recompute what was appended.
func streamPayload(stream string, seq uint64) []byte {
	n := int(seq*7%97) + 1
	b := make([]byte, 0, n+len(stream)+24)
	b = fmt.Appendf(b, "%s#%d#", stream, seq)
	for len(b) < cap(b) {
		b = append(b, byte('a'+seq%26))
	}
	return b
}

// digestOf hashes a sequence of (seq, data) pairs.
func digestOf(evs func(yield func(uint64, []byte) bool)) [32]byte {
	h := sha256.New()
	var n [8]byte
	for seq, data := range evs {
		binary.BigEndian.PutUint64(n[:], seq)
		h.Write(n[:])
		binary.BigEndian.PutUint64(n[:], uint64(len(data)))
		h.Write(n[:])
		h.Write(data)
	}
	var out [32]byte
	h.Sum(out[:0])
	return out
}

func expectedSuffix(name string, from, head uint64) [32]byte {
	return digestOf(func(yield func(uint64, []byte) bool) {
		for q := from; q <= head; q++ {
			if !yield(q, streamPayload(name, q)) {
				return
			}
		}
	})
}

func deliveredDigest(evs []storetest.Event) [32]byte {
	return digestOf(func(yield func(uint64, []byte) bool) {
		for _, e := range evs {
			if !yield(e.Seq, e.Data) {
				return
			}
		}
	})
}

// TestConcurrentAppendersAndReaders runs many appenders on many streams of
// several sessions while readers join mid-stream at random positions, get
// taken over, rejoin, mark deliveries and a sweeper runs; every reader must
// see exactly the contiguous suffix from where it attached. Afterwards a
// reader attaching from each possible seq gets exactly the suffix (sha256 of
// delivered vs appended).
func TestConcurrentAppendersAndReaders(t *testing.T) {
	const (
		sessions   = 4
		perSession = 4
		events     = 150
	)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	lim := storetest.BigLimits()
	lim.MaxStreamBytes = 64 << 10 // roomy: this test is about ordering, not bounds
	st, _ := newStore(t, buffer.Options{Limits: lim})

	type target struct {
		name string
		str  buffer.Stream
		prod buffer.Producer // the standalone stream's: an upstream GET feeds it
	}
	var targets []target
	for i := 0; i < sessions; i++ {
		s := storetest.MustSession(t, st, fmt.Sprintf("s%d", i))
		for j := 0; j < perSession; j++ {
			var str buffer.Stream
			var prod buffer.Producer
			if j == 0 {
				str = s.Standalone()
				prod = storetest.MustProduce(t, str) // so caught-up readers wait
			} else {
				str = storetest.MustStream(t, s)
			}
			targets = append(targets, target{fmt.Sprintf("s%d/%d", i, str.Num()), str, prod})
		}
	}

	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	fail := func(format string, args ...any) {
		select {
		case errs <- fmt.Errorf(format, args...):
		default:
		}
	}
	stopSweep := make(chan struct{})
	go func() { // a sweeper racing with everything (the clock does not move)
		for {
			select {
			case <-stopSweep:
				return
			default:
				st.Sweep()
				_ = st.Stats()
				_ = st.Sessions()
				time.Sleep(time.Millisecond)
			}
		}
	}()

	// appended[stream][seq] is what Append stored at seq, recorded by the
	// appenders; readers' results are checked against it at the end.
	appended := make([]map[uint64][]byte, len(targets))
	var amu sync.Mutex
	type reading struct {
		stream int
		from   uint64
		got    []storetest.Event
	}
	var readings []reading
	var liveAttaches atomic.Int64
	var rmu sync.Mutex

	for ti, tg := range targets {
		appended[ti] = make(map[uint64][]byte)
		// Three appenders per stream race for seqs.
		var producers sync.WaitGroup
		for a := 0; a < 3; a++ {
			wg.Add(1)
			producers.Add(1)
			go func() {
				defer wg.Done()
				defer producers.Done()
				for i := 0; i < events/3; i++ {
					data := []byte(fmt.Sprintf("%s/a%d/%d/%s", tg.name, a, i, make([]byte, (i*7+a)%97)))
					seq, err := tg.str.Append(context.Background(), buffer.Entry{Fields: storetest.Fields(data)})
					if err != nil || seq == 0 || seq > events {
						fail("%s: Append = %d, %v", tg.name, seq, err)
						return
					}
					amu.Lock()
					if _, dup := appended[ti][seq]; dup {
						fail("%s: seq %d assigned twice", tg.name, seq)
					}
					appended[ti][seq] = data
					amu.Unlock()
					if i%8 == 0 {
						time.Sleep(time.Duration(1+i%3) * 100 * time.Microsecond)
					}
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			producers.Wait()
			tg.str.Complete()
			if tg.prod != nil {
				tg.prod.Done() // its caught-up readers end
			}
		}()
		// Readers join at random positions at random times, read a while,
		// and are taken over by the next one.
		for k := 0; k < 3; k++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(seed, uint64(ti*10+k)))
				for round := 0; round < 8; round++ {
					time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
					v := tg.str.View()
					if v.State == policy.Live {
						liveAttaches.Add(1)
					}
					from := v.Floor + uint64(rng.IntN(int(v.Head+1-v.Floor)+1)) // floor..head+1
					r, err := tg.str.Attach(from)
					if err != nil {
						fail("%s: Attach(%d): %v", tg.name, from, err)
						return
					}
					var got []storetest.Event
					maxBytes := 1 + rng.IntN(16*200)
					want := rng.IntN(events)
					var rerr error
					for len(got) < want {
						evs, err := storetest.Read(context.Background(), r, maxBytes)
						got = append(got, evs...) // Data stays valid: events are immutable
						if len(evs) > 0 && rng.IntN(4) == 0 {
							r.Delivered(evs[len(evs)-1].Seq)
						}
						if err != nil {
							rerr = err
							break
						}
					}
					if rerr != nil && rerr != io.EOF && !errors.Is(rerr, buffer.ErrTakenOver) && !errors.Is(rerr, buffer.ErrProducerGone) {
						fail("%s: Read: %v", tg.name, rerr)
					}
					if (rerr == io.EOF || errors.Is(rerr, buffer.ErrProducerGone)) && (len(got) == 0 && from != events+1 || len(got) > 0 && got[len(got)-1].Seq != events) {
						fail("%s: EOF before the last event", tg.name)
					}
					rmu.Lock()
					readings = append(readings, reading{ti, from, got})
					rmu.Unlock()
					r.Close()
				}
			}()
		}
	}
	wg.Wait()
	close(stopSweep)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	expect := func(ti int, from, last uint64) [32]byte {
		return digestOf(func(yield func(uint64, []byte) bool) {
			for q := from; q <= last; q++ {
				if !yield(q, appended[ti][q]) {
					return
				}
			}
		})
	}
	for _, rd := range readings {
		if len(rd.got) == 0 {
			continue
		}
		last := rd.got[len(rd.got)-1].Seq
		if deliveredDigest(rd.got) != expect(rd.stream, rd.from, last) {
			t.Fatalf("%s: reader from %d got a wrong sequence (%d events, first %d, last %d)",
				targets[rd.stream].name, rd.from, len(rd.got), rd.got[0].Seq, last)
		}
	}
	if len(readings) != len(targets)*3*8 {
		t.Fatalf("%d readings", len(readings))
	}
	t.Logf("%d of %d readers joined a live stream", liveAttaches.Load(), len(readings))
	if liveAttaches.Load() == 0 {
		t.Fatal("no reader joined mid-stream")
	}

	// Every stream is complete and nothing was evicted (the clock never moved,
	// nothing was acked): a reader from each seq gets exactly the suffix.
	for ti, tg := range targets {
		if len(appended[ti]) != events {
			t.Fatalf("%s: %d distinct seqs appended, want %d", tg.name, len(appended[ti]), events)
		}
		v := tg.str.View()
		if v.Floor != 1 || v.Head != events || (v.State != policy.Complete && v.Kind == policy.RequestStream) {
			t.Fatalf("%s: view %+v", tg.name, v)
		}
		for from := uint64(1); from <= events+1; from++ {
			r, err := tg.str.Attach(from)
			if err != nil {
				t.Fatalf("%s: Attach(%d): %v", tg.name, from, err)
			}
			evs, err := storetest.ReadAll(t, r)
			if err != io.EOF && !errors.Is(err, buffer.ErrProducerGone) {
				t.Fatalf("%s from %d: %v", tg.name, from, err)
			}
			if got, want := deliveredDigest(evs), expect(ti, from, events); got != want || len(evs) != int(events+1-from) {
				t.Fatalf("%s: reader from %d got %d events with a different digest", tg.name, from, len(evs))
			}
			r.Close()
		}
	}
	if n := st.Counters().EventsEnqueued.Load(); n != uint64(len(targets)*events) {
		t.Fatalf("EventsEnqueued = %d, want %d", n, len(targets)*events)
	}
	if n := st.Counters().EventsEvicted.Load(); n != 0 {
		t.Fatalf("EventsEvicted = %d, want 0", n)
	}
}

// TestConcurrentBackpressure: appenders on a small shared budget keep going
// only because a consumer acks; every event arrives exactly once, in order,
// and nothing is evicted before it is acked.
func TestConcurrentBackpressure(t *testing.T) {
	const (
		streams = 8
		events  = 200
	)
	lim := storetest.BigLimits()
	lim.MaxStreamBytes = 8 * 200
	lim.MaxSessionBytes = 20 * 200
	lim.MaxTotalBytes = 40 * 200
	st, _ := newStore(t, buffer.Options{Limits: lim})
	var wg sync.WaitGroup
	errs := make(chan error, streams*2)
	for i := 0; i < streams; i++ {
		id := fmt.Sprintf("s%d", i%3) // several streams share a session
		s, ok := st.Session(id)
		if !ok {
			s = storetest.MustSession(t, st, id)
		}
		str := storetest.MustStream(t, s)
		name := fmt.Sprintf("bp%d", i)
		wg.Add(2)
		go func() {
			defer wg.Done()
			for q := uint64(1); q <= events; q++ {
				seq, err := str.Append(context.Background(), buffer.Entry{Fields: storetest.Fields(streamPayload(name, q))})
				if err != nil || seq != q {
					errs <- fmt.Errorf("%s: Append = %d, %v", name, seq, err)
					return
				}
			}
			str.Complete()
		}()
		go func() {
			defer wg.Done()
			r, err := str.Attach(1)
			if err != nil {
				errs <- err
				return
			}
			var got []storetest.Event
			for {
				evs, err := storetest.Read(context.Background(), r, 5*200)
				got = append(got, evs...)
				if len(evs) > 0 {
					buffer.Ack(str, evs[len(evs)-1].Seq) // the client confirms as it goes
				}
				if err == io.EOF {
					break
				}
				if err != nil {
					errs <- fmt.Errorf("%s: Read: %v", name, err)
					return
				}
			}
			if len(got) != events || deliveredDigest(got) != expectedSuffix(name, 1, events) {
				errs <- fmt.Errorf("%s: got %d events, wrong digest", name, len(got))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if s := st.Stats(); s.RetainedBytes != 0 {
		t.Errorf("RetainedBytes = %d after everything was acked", s.RetainedBytes)
	}
	if st.Counters().Stalls.Load() == 0 {
		t.Error("no append ever waited: the bounds were not exercised")
	}
	if n := st.Counters().EventsEvicted.Load(); n != streams*events {
		t.Errorf("EventsEvicted = %d, want %d", n, streams*events)
	}
}
