package natsstore

import (
	"context"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// How messages are made and stored: the framing of events, the end
// marker, and the one publish path every writer (a producer, the sweeper
// ending a dead producer's stream) takes.

// appendFramed frames an event for the client as the memory store does:
// its ID line, the upstream's fields, the blank line.
func appendFramed(dst []byte, epoch string, num uint32, seq uint64, fields []byte) []byte {
	dst = append(dst, "id: "...)
	dst = eventid.Append(dst, epoch, num, seq)
	dst = append(dst, '\n')
	dst = append(dst, fields...)
	return append(dst, '\n')
}

// endMarker is the empty message that ends a stream at head.
func endMarker(subject string, head uint64, off int64, state policy.StreamState, reason policy.Reason, upstream string) *nats.Msg {
	msg := nats.NewMsg(subject)
	if upstream != "" {
		msg.Header.Set(hdrUpstream, upstream) // the cursor as of head: it must not hide the last batch's
	}
	msg.Header.Set(hdrFirst, strconv.FormatUint(head+1, 10))
	msg.Header.Set(hdrOff, strconv.FormatInt(off, 10))
	if state == policy.Complete {
		msg.Header.Set(hdrEnd, "complete")
	} else {
		msg.Header.Set(hdrEnd, "failed")
		msg.Header.Set(hdrReason, string(reason))
	}
	return msg
}

// publishAfter publishes msg (ID id) if the subject's last message is at
// stream sequence expect, retrying what may pass. An ambiguous failure may
// have stored it: the retry's expectation then fails, and the subject's
// last message being this one says it was stored.
func (st *Store) publishAfter(msg *nats.Msg, id string, expect uint64, abort func() error, emptied func() bool) (uint64, error) {
	for round := 0; ; round++ {
		if err := abort(); err != nil {
			return 0, err
		}
		if st.ctx.Err() != nil {
			return 0, st.ctx.Err()
		}
		ctx, cancel := context.WithTimeout(st.ctx, 5*time.Second)
		msg.Header.Set(jetstream.MsgIDHeader, id)
		msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expect, 10))
		seq, err := st.publish(ctx, msg)
		cancel()
		if err == nil {
			return seq, nil
		}
		switch {
		case isWrongLast(err):
			ctx, cancel := context.WithTimeout(st.ctx, 5*time.Second)
			last, lerr := st.lastMsg(ctx, msg.Subject)
			cancel()
			switch {
			case lerr != nil:
			case last != nil && last.id == id:
				return last.seq, nil
			case last == nil && expect != 0 && emptied != nil && emptied():
				expect = 0
				continue
			default:
				return 0, errConflict
			}
		case isStoreFull(err):
			// Backpressure: appends block on the total bound meanwhile.
			st.fault("publish", err)
			st.total.invalidate()
			select {
			case <-st.freed.wait():
			case <-time.After(min(backoff(round), 250*time.Millisecond)):
			case <-st.ctx.Done():
			}
			continue
		case !transient(err):
			st.fault("publish", err)
			return 0, err
		default:
			st.fault("publish", err)
		}
		if !sleepCtx(st.ctx, backoff(round)) {
			return 0, st.ctx.Err()
		}
	}
}

// outMsg is one of the messages that store a batch.
type outMsg struct {
	msg     *nats.Msg
	id      string  // Nats-Msg-Id (a part's is completed with what it follows: see storeMsgs)
	part    int     // 0, or which part of an event it is (from 1)
	partial bool    // an event's part other than its last: it stores no event
	last    uint64  // the last event it completes
	endOff  int64   // the stream's byte count after it
	stored  int64   // what JetStream counts for it, once published
	info    msgInfo // what its headers say, but its stream sequence (for the local feed)
}

// msgs splits b into the messages that store it, in order: each run of
// consecutive events that fits room bytes is one message, and an event
// larger than room is stored alone, in parts of at most room bytes (a
// batch is one message but for such an event). Only an event's last part
// carries what the event answers and the upstream's cursor.
func (b *batch) msgs(subject, key string, room int) []outMsg {
	if len(b.buf) <= room {
		return []outMsg{{msg: b.msg(subject), id: key + "." + strconv.FormatUint(b.first, 10),
			last: b.last(), endOff: b.off + int64(len(b.buf)), info: b.info()}}
	}
	var out []outMsg
	start, runPos, pos := 0, 0, 0 // the run's first event and its byte position; where event i starts
	run := func(end int) {        // events [start, end), bytes [runPos, pos)
		if end == start {
			return
		}
		sub := batch{buf: b.buf[runPos:pos], lens: b.lens[start:end], first: b.first + uint64(start),
			off: b.off + int64(runPos), upstream: b.upAt(end - 1), own: b.ownIn(start, end)}
		sub.answers = answersIn(b.answers, sub.first, sub.last())
		out = append(out, outMsg{msg: sub.msg(subject), id: key + "." + strconv.FormatUint(sub.first, 10),
			last: sub.last(), endOff: sub.off + int64(len(sub.buf)), info: sub.info()})
	}
	for i, n := range b.lens {
		if n <= room {
			if pos+n-runPos > room {
				run(i)
				start, runPos = i, pos
			}
			pos += n
			continue
		}
		run(i)
		seq, off := b.first+uint64(i), b.off+int64(pos)
		k := (n + room - 1) / room
		size := (n + k - 1) / k // parts of (nearly) equal size
		for p := 1; p <= k; p++ {
			msg := nats.NewMsg(subject)
			msg.Data = b.buf[pos+(p-1)*size : pos+min(p*size, n)]
			msg.Header.Set(hdrFirst, strconv.FormatUint(seq, 10))
			msg.Header.Set(hdrOff, strconv.FormatInt(off, 10))
			msg.Header.Set(hdrPart, strconv.Itoa(p)+"/"+strconv.Itoa(k))
			msg.Header.Set(hdrSize, strconv.Itoa(n))
			o := outMsg{msg: msg, id: key + "." + strconv.FormatUint(seq, 10) + ".p" + strconv.Itoa(p),
				part: p, partial: p < k, last: seq - 1, endOff: off,
				info: msgInfo{first: seq, off: off, size: len(msg.Data), part: p, parts: k, total: n}}
			if p == k {
				if as := answersIn(b.answers, seq, seq); len(as) > 0 {
					msg.Header.Set(hdrAnswers, encodeAnswers(as))
				}
				if up := b.upAt(i); up != "" {
					msg.Header.Set(hdrUpstream, up)
				}
				if own := b.ownIn(i, i+1); len(own) == 1 && own[0] != b.upAt(i) {
					msg.Header.Set(hdrIDs, joinIDs(own))
				}
				o.last, o.endOff = seq, off+int64(n)
			}
			out = append(out, o)
		}
		pos += n
		start, runPos = i+1, pos
	}
	run(len(b.lens))
	return out
}

// info is what the headers of the message storing b say (but its stream
// sequence), as parseMsg would read them.
func (b *batch) info() msgInfo {
	m := msgInfo{first: b.first, off: b.off, size: len(b.buf), answers: b.answers, upstream: b.upstream}
	if len(b.lens) > 1 {
		m.lens = b.lens
	}
	return m
}

// upAt is the upstream's cursor as of the batch's event i.
func (b *batch) upAt(i int) string {
	if i < len(b.ups) {
		return b.ups[i]
	}
	return b.upstream
}

func answersIn(as []answer, first, last uint64) []answer {
	var out []answer
	for _, a := range as {
		if a.seq >= first && a.seq <= last {
			out = append(out, a)
		}
	}
	return out
}

// storeMsgs publishes msgs in order, each expecting the one before it (the
// first, expect), and tells stored of each once it is stored. A part's
// message ID names the message it follows too: a writer that takes a
// stream over after an event was left incomplete stores that seq again,
// and must not meet the abandoned parts' IDs in the duplicate window. An
// event's later parts never start the subject afresh (emptied): a part
// whose predecessors are gone must not be stored alone.
func (st *Store) storeMsgs(msgs []outMsg, expect uint64, abort func() error, emptied func() bool, stored func(o *outMsg, seq uint64)) (uint64, error) {
	for i := range msgs {
		o := &msgs[i]
		id, empt := o.id, emptied
		if o.part > 0 {
			id += "." + strconv.FormatUint(expect, 10)
		}
		if o.part > 1 {
			empt = nil
		}
		seq, err := st.publishAfter(o.msg, id, expect, abort, empt)
		if err != nil {
			return expect, err
		}
		o.stored = storedSize(o.msg, id)
		expect = seq
		if stored != nil {
			stored(o, seq)
		}
	}
	return expect, nil
}
