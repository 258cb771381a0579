package natsstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// A message on <P>.ev.<key> holds a run of consecutive events, each framed
// for the client exactly as the memory store frames it, back to back. Its
// headers say which events it holds and where they start in the stream's
// byte count, so a reader, an evicting replica or a new producer can place
// it without reading what came before. An end marker is an empty message
// that ends the stream; a takeover marker, an empty message that ends
// nothing. An event larger than one message (the servers'
// max_payload less headerRoom) is stored as several consecutive messages,
// its parts: each carries the event's seq and offset, "Mcpr-Part: i/n" and
// the event's framed length; only the last one carries what the event
// answers and the upstream's cursor, and only it makes the event stored.
const (
	hdrFirst   = "Mcpr-First"   // seq of the first event (an end marker: head+1)
	hdrLens    = "Mcpr-Lens"    // the events' framed lengths, comma-separated (absent: one event)
	hdrOff     = "Mcpr-Off"     // framed bytes of all the stream's events before the first
	hdrAnswers = "Mcpr-Answers" // JSON [[request id, seq], ...]: answers among the events
	hdrEnd     = "Mcpr-End"     // on an end marker: "complete" or "failed"
	hdrReason  = "Mcpr-Reason"  // on a failed end marker: the reason
	// hdrUpstream is the upstream's event ID as of the batch's last event:
	// where a producer that takes the stream over asks the upstream to
	// resume, even if the one before it died without recording it.
	hdrUpstream = "Mcpr-Upstream"
	hdrPart     = "Mcpr-Part" // on a part of an event: "<i>/<n>", i from 1
	hdrSize     = "Mcpr-Size" // on a part of an event: the event's framed length
	// hdrIDs is the upstream's own ID of each event the message completes
	// (tail.go), where Mcpr-Upstream does not say it: absent, the
	// message's one event came with the ID Mcpr-Upstream names.
	hdrIDs = "Mcpr-Ids"
	// hdrTakeover marks the fence a producer that takes a request stream
	// over stores first (takeover.go): an empty message, like an end
	// marker that ends nothing; its value names the new producer.
	hdrTakeover = "Mcpr-Takeover"
)

// msgInfo is what a message's headers say.
type msgInfo struct {
	seq      uint64 // stream sequence
	first    uint64
	lens     []int // nil: one event (the whole payload), or none (an end marker)
	off      int64
	size     int
	id       string // Nats-Msg-Id
	end      policy.StreamState
	reason   policy.Reason
	answers  []answer
	upstream string // hdrUpstream
	ids      string // hdrIDs, undecoded: only a takeover reads it (tail.go)
	// An event's part (parts > 0): part of parts, total the event's framed
	// length. Only the last part makes the event stored (count, last and
	// endOff say so); every part reaches the event (reaches).
	part, parts int
	total       int
}

type answer struct {
	id  string
	seq uint64
}

func parseMsg(seq uint64, h nats.Header, data []byte) (msgInfo, error) {
	m := msgInfo{seq: seq, size: len(data), id: h.Get(jetstream.MsgIDHeader), upstream: h.Get(hdrUpstream), ids: h.Get(hdrIDs)}
	var err error
	if m.first, err = strconv.ParseUint(h.Get(hdrFirst), 10, 64); err != nil {
		return m, fmt.Errorf("natsstore: message %d: bad %s", seq, hdrFirst)
	}
	if m.off, err = strconv.ParseInt(h.Get(hdrOff), 10, 64); err != nil {
		return m, fmt.Errorf("natsstore: message %d: bad %s", seq, hdrOff)
	}
	if l := h.Get(hdrLens); l != "" {
		parts := strings.Split(l, ",")
		m.lens = make([]int, len(parts))
		total := 0
		for i, p := range parts {
			if m.lens[i], err = strconv.Atoi(p); err != nil || m.lens[i] <= 0 {
				return m, fmt.Errorf("natsstore: message %d: bad %s", seq, hdrLens)
			}
			total += m.lens[i]
		}
		if total != len(data) {
			return m, fmt.Errorf("natsstore: message %d: lengths do not add up", seq)
		}
	}
	if p := h.Get(hdrPart); p != "" {
		i, n, _ := strings.Cut(p, "/")
		var e1, e2, e3 error
		m.part, e1 = strconv.Atoi(i)
		m.parts, e2 = strconv.Atoi(n)
		m.total, e3 = strconv.Atoi(h.Get(hdrSize))
		if e1 != nil || e2 != nil || e3 != nil || m.parts < 2 || m.part < 1 || m.part > m.parts ||
			m.lens != nil || m.size == 0 || m.size > m.total {
			return m, fmt.Errorf("natsstore: message %d: bad %s", seq, hdrPart)
		}
	}
	switch e := h.Get(hdrEnd); e {
	case "":
		m.end = policy.Live
	case "complete":
		m.end = policy.Complete
	default:
		m.end, m.reason = policy.Failed, policy.Reason(h.Get(hdrReason))
	}
	if a := h.Get(hdrAnswers); a != "" {
		var raw [][2]json.RawMessage
		if json.Unmarshal([]byte(a), &raw) == nil {
			for _, p := range raw {
				var id string
				var s uint64
				if json.Unmarshal(p[0], &id) == nil && json.Unmarshal(p[1], &s) == nil {
					m.answers = append(m.answers, answer{id, s})
				}
			}
		}
	}
	return m, nil
}

func encodeAnswers(as []answer) string {
	raw := make([][2]any, len(as))
	for i, a := range as {
		raw[i] = [2]any{a.id, a.seq}
	}
	b, _ := json.Marshal(raw)
	return string(b)
}

func joinLens(lens []int) string {
	b := make([]byte, 0, len(lens)*5)
	for i, n := range lens {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(n), 10)
	}
	return string(b)
}

// count is the number of events the message completes: an event's part
// other than its last completes none.
func (m *msgInfo) count() int {
	switch {
	case m.parts > 0:
		if m.part == m.parts {
			return 1
		}
		return 0
	case m.lens != nil:
		return len(m.lens)
	case m.size > 0:
		return 1
	}
	return 0
}

// last is the seq of its last event (first-1 for an end marker: the head;
// first-1 for an event's part other than its last: the event is stored
// only once its last part is).
func (m *msgInfo) last() uint64 { return m.first + uint64(m.count()) - 1 }

// reaches is the highest seq the message holds bytes of: where a search
// for an event must stop (at an event's first part).
func (m *msgInfo) reaches() uint64 {
	if m.parts > 0 {
		return m.first
	}
	return m.last()
}

// endOff is the byte count of the stream after its events (stored in
// full).
func (m *msgInfo) endOff() int64 {
	switch {
	case m.parts == 0:
		return m.off + int64(m.size)
	case m.part == m.parts:
		return m.off + int64(m.total)
	}
	return m.off
}

// partial reports an event's part other than its last.
func (m *msgInfo) partial() bool { return m.parts > 0 && m.part < m.parts }

// span returns where event seq (first..last) starts and ends in the payload.
func (m *msgInfo) span(seq uint64) (start, end int) {
	if m.lens == nil {
		return 0, m.size
	}
	k := int(seq - m.first)
	for i := 0; i < k; i++ {
		start += m.lens[i]
	}
	return start, start + m.lens[k]
}

// offsetOf is the stream's byte count before event seq of this message.
func (m *msgInfo) offsetOf(seq uint64) int64 {
	if seq <= m.first {
		return m.off
	}
	if seq > m.last() {
		return m.endOff()
	}
	start, _ := m.span(seq)
	return m.off + int64(start)
}

// lastMsg returns the last message on subject (nil if it holds none).
func (st *Store) lastMsg(ctx context.Context, subject string) (*msgInfo, error) {
	for round := 0; ; round++ {
		raw, err := st.events.GetLastMsgForSubject(ctx, subject)
		switch {
		case err == nil:
			m, err := parseMsg(raw.Sequence, raw.Header, raw.Data)
			return &m, err
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return nil, nil
		case !transient(err) || round >= 10:
			st.fault("get_msg", err)
			return nil, err
		}
		if !sleepCtx(ctx, backoff(round)) {
			return nil, ctx.Err()
		}
	}
}

// nextMsg returns the first message on subject at or after sequence seq
// (nil if none), with its payload.
func (st *Store) nextMsg(ctx context.Context, subject string, seq uint64) (*msgInfo, []byte, error) {
	for round := 0; ; round++ {
		raw, err := st.events.GetMsg(ctx, max(seq, 1), jetstream.WithGetMsgSubject(subject))
		switch {
		case err == nil:
			m, err := parseMsg(raw.Sequence, raw.Header, raw.Data)
			return &m, raw.Data, err
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return nil, nil, nil
		case !transient(err) || round >= 10:
			st.fault("get_msg", err)
			return nil, nil, err
		}
		if !sleepCtx(ctx, backoff(round)) {
			return nil, nil, ctx.Err()
		}
	}
}

// locate finds the first message on subject whose events reach seq (at:
// for an event stored in parts, its first part),
// and the subject's last message (last); either may be nil. Messages of a
// subject hold increasing seqs in increasing stream sequence, so a binary
// search over stream sequences, each probe a "next message on the subject"
// direct get, needs no index. hint is a stream sequence known to be at or
// below the answer.
func (st *Store) locate(ctx context.Context, subject string, seq, hint uint64) (at, last *msgInfo, err error) {
	if last, err = st.lastMsg(ctx, subject); err != nil || last == nil || last.reaches() < seq {
		return nil, last, err
	}
	best := last
	lo := max(hint, 1)
	// Most searches start at the first retained message: try it first.
	if m, _, err := st.nextMsg(ctx, subject, lo); err != nil {
		return nil, last, err
	} else if m != nil && m.seq < best.seq {
		if m.reaches() >= seq {
			return m, last, nil
		}
		lo = m.seq + 1
	}
	hi := best.seq // candidates lie in [lo, hi)
	for lo < hi {
		mid := lo + (hi-lo)/2
		m, _, err := st.nextMsg(ctx, subject, mid)
		if err != nil {
			return nil, last, err
		}
		switch {
		case m == nil || m.seq >= hi:
			hi = mid // nothing of the subject in [mid, hi)
		case m.reaches() >= seq:
			best, hi = m, m.seq
		default:
			lo = m.seq + 1
		}
	}
	return best, last, nil
}

// purge removes the messages on subject (a wildcard is allowed) below
// stream sequence before (0: all of them).
func (st *Store) purge(ctx context.Context, subject string, before uint64) error {
	opts := []jetstream.StreamPurgeOpt{jetstream.WithPurgeSubject(subject)}
	if before > 0 {
		opts = append(opts, jetstream.WithPurgeSequence(before))
	}
	for round := 0; ; round++ {
		err := st.events.Purge(ctx, opts...)
		if err == nil || !transient(err) || round >= 10 {
			return err
		}
		if !sleepCtx(ctx, backoff(round)) {
			return ctx.Err()
		}
	}
}
