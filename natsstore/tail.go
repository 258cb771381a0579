package natsstore

// The upstream IDs of the stored events, for a producer that takes a
// stream over (buffer.UpstreamTail): the upstream's replay from the
// cursor may resend the event at it and a few before it, and the new
// producer drops those only if it knows what the stream holds under which
// upstream ID. Mcpr-Upstream is the cursor as of a message's last event,
// which may be a note (a priming event's ID) rather than that event's own,
// and says nothing of the events before it in the message; Mcpr-Ids does,
// only where it must: a message holding one event that came with the ID
// Mcpr-Upstream names (a short call's usual message) goes without it, so
// the hot path pays a string comparison. The events a takeover's replay
// repeats are mostly ones its client acknowledged, evicted by then: an
// eviction that purges some of a live request stream's last
// buffer.TailKeep events first reads them and keeps their IDs and sums
// in the stream record (Tail). A takeover reads those, then the events
// still stored.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
)

// ownIn is the upstream IDs events [start, end) of b came with (nil for a
// batch made without them).
func (b *batch) ownIn(start, end int) []string {
	if end > len(b.own) {
		return nil
	}
	return b.own[start:end]
}

// ids is b's Mcpr-Ids value, if its message needs one: more than one
// event, or an event whose own ID is not the cursor its message carries.
func (b *batch) ids() (string, bool) {
	if len(b.own) != len(b.lens) || len(b.own) == 1 && b.own[0] == b.upstream {
		return "", false
	}
	return joinIDs(b.own), true
}

// joinIDs encodes upstream IDs for Mcpr-Ids: comma-separated, each with
// '%', ',' and the bytes a header value may not hold or would lose
// (controls, space: a value is trimmed) as %XX; no ID is "%00" (an SSE ID
// never holds NUL: the spec ignores one that does), so no element is empty.
// An ID longer than maxTailID is recorded as none (its repeat, if a replay
// sends one, gets through): a message's headers have headerRoom, and an
// upstream's IDs have no bound of their own.
func joinIDs(ids []string) string {
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		if len(id) > maxTailID {
			id = ""
		}
		b.WriteString(escapeID(id, false))
	}
	return b.String()
}

// escapeID is id as one element of Mcpr-Ids: '%', ',' and the bytes a
// header value may not hold or would lose (controls, space: a value is
// trimmed) as %XX, and with nonASCII every byte past 0x7f too; no ID is
// "%00".
func escapeID(id string, nonASCII bool) string {
	const hex = "0123456789ABCDEF"
	if id == "" {
		return "%00"
	}
	var b strings.Builder
	for j := 0; j < len(id); j++ {
		c := id[j]
		if c <= ' ' || c == ',' || c == '%' || c == 0x7f || nonASCII && c > 0x7f {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// maxTailID bounds the upstream IDs Mcpr-Ids records: a message of
// maxBatch events stays within a few KiB of headers, escaped at worst
// (SDK servers' IDs are tens of bytes).
const maxTailID = 128

var errBadIDs = errors.New("natsstore: bad " + hdrIDs)

// splitIDs decodes a Mcpr-Ids value of n IDs.
func splitIDs(v string, n int) ([]string, error) {
	parts := strings.Split(v, ",")
	if len(parts) != n {
		return nil, errBadIDs
	}
	for i, p := range parts {
		if p == "%00" {
			parts[i] = ""
			continue
		}
		if !strings.Contains(p, "%") {
			continue
		}
		var b strings.Builder
		for j := 0; j < len(p); j++ {
			if p[j] != '%' {
				b.WriteByte(p[j])
				continue
			}
			if j+2 >= len(p) {
				return nil, errBadIDs
			}
			hi, lo := unhex(p[j+1]), unhex(p[j+2])
			if hi < 0 || lo < 0 {
				return nil, errBadIDs
			}
			b.WriteByte(byte(hi<<4 | lo))
			j += 2
		}
		parts[i] = b.String()
	}
	return parts, nil
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	}
	return -1
}

// ownIDs is the upstream ID of each event m completes. A message stored
// before Mcpr-Ids existed says it for one event only (as its cursor); its
// events' IDs are otherwise unknown (""): the replay's repeats of them get
// through, as before.
func (m *msgInfo) ownIDs() []string {
	n := m.count()
	if m.ids != "" {
		if ids, err := splitIDs(m.ids, n); err == nil {
			return ids
		}
	}
	ids := make([]string, n)
	if n == 1 {
		ids[0] = m.upstream
	}
	return ids
}

// tailEntry is one of a stream's last events as the record keeps it past
// its eviction.
type tailEntry struct {
	Seq uint64 `json:"s"`
	ID  string `json:"i"`
	Sum uint64 `json:"h"`
}

// tailJSON is a tailEntry as the record holds it: the ID %-escaped as
// Mcpr-Ids holds it, and every byte past ASCII too, since JSON holds only
// UTF-8 and an SSE id line may carry any byte.
type tailJSON struct {
	Seq uint64 `json:"s"`
	ID  string `json:"i"`
	Sum uint64 `json:"h"`
}

func (e tailEntry) MarshalJSON() ([]byte, error) {
	return json.Marshal(tailJSON{Seq: e.Seq, ID: escapeID(e.ID, true), Sum: e.Sum})
}

func (e *tailEntry) UnmarshalJSON(b []byte) error {
	var j tailJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	ids, err := splitIDs(j.ID, 1)
	if err != nil {
		return err
	}
	*e = tailEntry{Seq: j.Seq, ID: ids[0], Sum: j.Sum}
	return nil
}

// readTail returns the events from..to (to at most last's) that came with
// an upstream ID, reading forward from the message holding from: an event
// stored in parts is put together (one at a time, at most
// max_event_bytes), a torn one (its producer died between its parts) is
// none of the stream's.
func (st *Store) readTail(ctx context.Context, subject string, from, to, hint uint64, last *msgInfo) ([]tailEntry, error) {
	if from > to {
		return nil, nil
	}
	at, _, err := st.locate(ctx, subject, from, hint)
	if err != nil || at == nil {
		return nil, err
	}
	var out []tailEntry
	add := func(seq uint64, framed []byte, id string) {
		// Framed for the client: the proxy's "id:" line, the fields, the
		// blank line.
		if i := bytes.IndexByte(framed, '\n'); id != "" && len(id) <= maxTailID && seq >= from && seq <= to && i >= 0 && len(framed) > i+1 {
			out = append(out, tailEntry{Seq: seq, ID: id, Sum: buffer.FieldsSum(framed[i+1 : len(framed)-1])})
		}
	}
	var part []byte // an event in parts, so far
	partOf := uint64(0)
	for next := at.seq; next <= last.seq; {
		m, data, err := st.nextMsg(ctx, subject, next)
		if err != nil {
			return out, err
		}
		if m == nil || m.seq > last.seq || m.first > to {
			return out, nil
		}
		next = m.seq + 1
		switch {
		case m.parts > 0:
			if m.part == 1 {
				part, partOf = append(part[:0], data...), m.first
			} else if partOf == m.first && len(part) > 0 {
				part = append(part, data...)
			} else {
				part, partOf = part[:0], 0 // a torn event's later parts
			}
			if m.part == m.parts && partOf == m.first && len(part) == m.total {
				add(m.first, part, m.ownIDs()[0])
				part, partOf = part[:0], 0
			}
		default:
			ids := m.ownIDs()
			for k := range m.count() {
				seq := m.first + uint64(k)
				start, end := m.span(seq)
				add(seq, data[start:end], ids[k])
			}
		}
	}
	return out, nil
}

// tailRing is what a writer keeps of the last buffer.TailKeep events it
// added, each with its own upstream ID ("" for none, or one past
// maxTailID) and FieldsSum: an eviction on the producer's replica (a
// client resuming where its call runs, the embedded store's only replica)
// takes the tail from it instead of reading the events back.
type tailRing struct {
	ents  [buffer.TailKeep]tailEntry
	n     int    // entries held, at most TailKeep
	first uint64 // seq of the first event the writer added (0: none yet)
}

func (t *tailRing) add(seq uint64, id string, fields []byte) {
	if t.first == 0 {
		t.first = seq
	}
	if len(id) > maxTailID {
		id = ""
	}
	e := tailEntry{Seq: seq, ID: id}
	if id != "" {
		e.Sum = buffer.FieldsSum(fields)
	}
	t.ents[seq%buffer.TailKeep] = e
	t.n = min(t.n+1, buffer.TailKeep)
}

// span returns the entries with IDs of from..to, if the ring holds every
// event of that range.
func (t *tailRing) span(from, to uint64) ([]tailEntry, bool) {
	if t.n == 0 || from < t.first {
		return nil, false
	}
	out := []tailEntry{}
	for seq := from; seq <= to; seq++ {
		e := t.ents[seq%buffer.TailKeep]
		if e.Seq != seq {
			return nil, false // gone from the ring, or never added here
		}
		if e.ID != "" {
			out = append(out, e)
		}
	}
	return out, true
}

// localTail is the tail from..to as the writer of key on this replica
// keeps it, if it does.
func (st *Store) localTail(key string, from, to uint64) ([]tailEntry, bool) {
	v, ok := st.byKey.Load(key)
	if !ok {
		return nil, false
	}
	w := v.(*stream).currentWriter()
	if w == nil {
		return nil, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.tail.span(from, to)
}

// evictedTail is what an eviction to floor of a live request stream
// keeps in its record: the events among the last buffer.TailKeep before
// the subject's last message (last) that it purges. Only an eviction that
// reaches that far pays for reading them: a client's resume that
// acknowledges all it got, or a call quiet past the resume window.
func (st *Store) evictedTail(ctx context.Context, key, subject string, rec *streamRecord, floor uint64, last *msgInfo) []tailEntry {
	head := max(rec.Head, last.last())
	lo := max(rec.Floor, 1)
	if head >= buffer.TailKeep {
		lo = max(lo, head-buffer.TailKeep+1)
	}
	if floor == 0 || lo > floor-1 {
		return nil
	}
	if tail, ok := st.localTail(key, lo, floor-1); ok {
		return tail
	}
	tail, err := st.readTail(ctx, subject, lo, floor-1, rec.FloorMsg, last)
	if err != nil {
		return nil // a takeover's filter misses them: its replay's repeats get through
	}
	if tail == nil {
		tail = []tailEntry{}
	}
	return tail
}

// mergeTail adds the entries evicted now to those kept before, and keeps
// those among the last buffer.TailKeep events up to head.
func mergeTail(kept, evicted []tailEntry, head uint64) []tailEntry {
	var out []tailEntry
	first := uint64(1)
	if head >= buffer.TailKeep {
		first = head - buffer.TailKeep + 1
	}
	lo := ^uint64(0)
	if len(evicted) > 0 {
		lo = evicted[0].Seq
	}
	for _, e := range kept {
		if e.Seq >= first && e.Seq < lo {
			out = append(out, e)
		}
	}
	for _, e := range evicted {
		if e.Seq >= first {
			out = append(out, e)
		}
	}
	return out
}

// UpstreamTail implements buffer.UpstreamTail: what the record kept of
// the events evicted, then the events still stored, read from the
// message holding the nth before the last (a binary search, as a
// reader's start) to the last whole message: at most n events' messages,
// and a few for the search.
func (s *stream) UpstreamTail(ctx context.Context, n int, each func(buffer.TailEvent)) error {
	if n <= 0 {
		return nil
	}
	st := s.sess.st
	if _, _, err := st.streams.fetch(ctx, s.key); err != nil && !errors.Is(err, errNotFound) {
		return err // the record as the last eviction left it
	}
	rec, ok := s.record()
	if !ok {
		return buffer.ErrStreamEnded
	}
	last, err := st.lastWhole(ctx, s.subject, rec.FloorMsg)
	if err != nil {
		return err
	}
	head := rec.Head
	if last != nil {
		head = max(head, last.last())
	}
	first := uint64(1)
	if head > uint64(n) {
		first = head - uint64(n) + 1
	}
	for _, e := range rec.Tail {
		if e.Seq >= first && e.Seq < rec.Floor {
			each(buffer.TailEvent{Seq: e.Seq, ID: e.ID, Sum: e.Sum})
		}
	}
	if last == nil {
		return nil
	}
	stored, err := st.readTail(ctx, s.subject, max(first, rec.Floor), head, rec.FloorMsg, last)
	for _, e := range stored {
		each(buffer.TailEvent{Seq: e.Seq, ID: e.ID, Sum: e.Sum})
	}
	return err
}

var _ buffer.UpstreamTail = (*stream)(nil)
