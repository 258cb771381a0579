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
func endMarker(subject string, head uint64, off int64, state policy.StreamState, reason policy.Reason) *nats.Msg {
	msg := nats.NewMsg(subject)
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
		ack, err := st.js.PublishMsg(ctx, msg, jetstream.WithMsgID(id), jetstream.WithExpectLastSequencePerSubject(expect))
		cancel()
		if err == nil {
			return ack.Sequence, nil
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
