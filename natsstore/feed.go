package natsstore

import (
	"time"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// The local feed: a reader on the replica that produces its request stream
// takes the stream's messages from the writer, once JetStream has
// acknowledged each, instead of from a consumer of its own. The bytes are
// the ones stored, and only stored ones are handed over, so a client still
// sees only what the store accepted; what the feed saves is a consumer
// created and deleted, a search for the reader's first message and the
// deliveries back from the server: most of what a short call cost a
// reader. Only request streams are fed: one is only ever stored by its
// producer (or, once its lease has lapsed, by a sweeper ending it, which
// the reader sees in the record and leaves the feed for), while the
// standalone stream's producer may move to another replica. Readers
// elsewhere, of the standalone stream, that attach once events are stored
// (resumes), or that need what the feed no longer holds read a consumer,
// as before.

// feedMax bounds the bytes a feed holds for a reader that falls behind;
// past it the oldest go, and the reader goes on with a consumer.
const feedMax = 1 << 20

// fedMsg is a stored message of the stream, as a consumer would deliver it.
type fedMsg struct {
	info msgInfo
	data []byte
}

// feed is what the writer keeps for its local reader. Every stored message
// that holds events from `from` on is in msgs, in order; nothing is kept
// while no reader is registered.
type feed struct {
	reader *reader
	from   uint64
	msgs   []fedMsg
	bytes  int
}

// register makes the writer feed r from seq next, if nothing from next on
// is stored yet or being stored (a publish under way would be stored
// before the feed knew of it): the connection that attaches as its stream
// opens. Any other reader (a resume, a takeover) reads a consumer. It
// reports whether the writer feeds r.
func (w *writer) register(r *reader, next uint64) bool {
	if w == nil || w.s.kind != policy.RequestStream {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil || w.stopErr != nil || next <= w.stored || w.flushing {
		return false
	}
	w.feed = feed{reader: r, from: next}
	return true
}

// unregister stops feeding r (its connection closed).
func (w *writer) unregister(r *reader) {
	if w == nil {
		return
	}
	w.mu.Lock()
	if w.feed.reader == r {
		w.feed = feed{}
	}
	w.mu.Unlock()
}

// fedLocked adds a stored message to the feed.
func (w *writer) fedLocked(info msgInfo, data []byte) {
	f := &w.feed
	if f.reader == nil {
		return
	}
	f.msgs = append(f.msgs, fedMsg{info, data})
	f.bytes += len(data)
	for f.bytes > feedMax && len(f.msgs) > 1 {
		f.dropFirst(true)
	}
}

// dropFirst forgets the oldest message; lost says the reader had not
// taken it, so the feed no longer holds what it needs.
func (f *feed) dropFirst(lost bool) {
	m := f.msgs[0]
	f.msgs[0] = fedMsg{}
	f.msgs = f.msgs[1:]
	f.bytes -= len(m.data)
	if lost {
		f.from = max(f.from, m.info.reaches()+1)
	}
}

// next returns, for r at seq next having taken messages up to stream
// sequence after, the next message of the feed holding events from next
// on. usable is false if the feed cannot serve r any more: it lost what r
// needs, the writer can store nothing more, or someone else stored to the
// stream (head, as its record has it, is past what the writer stored).
// The messages r has passed go.
func (w *writer) next(r *reader, next, after, head uint64) (m fedMsg, ok, usable bool) {
	if w == nil {
		return fedMsg{}, false, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	f := &w.feed
	if f.reader != r || w.err != nil || next < f.from || head > w.stored {
		return fedMsg{}, false, false
	}
	for len(f.msgs) > 0 && f.msgs[0].info.seq <= after {
		f.dropFirst(false)
	}
	for _, m := range f.msgs {
		if m.info.reaches() >= next {
			return m, true, true
		}
	}
	return fedMsg{}, false, true
}

// leaveWaitMax bounds how long a stream's end waits for its fed reader to
// deliver the last of it: its relay was woken by the same acknowledgement.
const leaveWaitMax = 5 * time.Millisecond

// leaveWithEnd returns, if r (the fed reader, or nil) delivers everything
// up to head within leaveWaitMax, what the stream's end writes for it: its
// deliveries, and its entry gone, as its close would have written a moment
// later. The reader then ends with io.EOF (recordChanged), and its close
// writes nothing: a short call's end and its client's leaving are one
// write. Otherwise nil, and the reader leaves as any other.
func (r *reader) leaveWithEnd(head uint64) func(*streamRecord) {
	if r == nil {
		return nil
	}
	deadline := time.NewTimer(leaveWaitMax)
	defer deadline.Stop()
	for {
		ch := r.progressed.wait()
		if d, _ := r.progress(); d >= head {
			break
		}
		select {
		case <-ch:
		case <-r.done:
			return nil
		case <-deadline.C:
			return nil
		}
	}
	quantum := r.st.deliveryQuantum()
	return func(rec *streamRecord) {
		leaves := rec.Reader != nil && rec.Reader.ID == r.id
		if leaves {
			d, sent := r.progress()
			rec.delivered(d, sent.UnixNano(), quantum)
			rec.Reader = nil
		}
		r.leaving.Store(leaves)
	}
}
