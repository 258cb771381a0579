package buffer

import (
	"math/bits"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// eventLog is one stream's retained events, each framed for clients ("id:"
// line, the upstream's fields, blank line) and packed back to back in chunks,
// so appending costs no allocation per event and replay hands out slices of
// whole runs of events. It is a plain data structure: memStream's mutex
// guards it, and the byte budget is reserved before it grows.
//
// Its size is the capacity it holds (chunk buffers, their indexes, a fixed
// overhead per chunk), not the bytes of the events in it: a chunk's memory
// returns only when its last event is evicted, and the bounds must hold on
// real memory.
type eventLog struct {
	epoch string // framing: every ID is <epoch>-<num>-<seq>
	num   uint32
	// idPrefix is every event's "id: <epoch>-<num>-", formatted once;
	// digits is the length of head+1 in decimal, and pow10 the next seq
	// with one digit more.
	idPrefix      string
	digits, pow10 uint64

	chunks      []*chunk // chunks[0] holds the floor, unless the log is empty
	floor, head uint64   // lowest retained seq (head+1 when empty), last seq assigned
	live        int64    // framed bytes of the retained events, for chunk sizing
	size        int64    // capacity held, as counted against the bounds
	maxChunk    int
	fixedChunk  int // tests: every chunk this size, or one event's if larger

	// deliveries record that every event up to seq was written and flushed
	// to a client by at. Deliveries within one quantum share a record that
	// keeps the latest time, so an event is never taken for delivered
	// earlier than it was, and a stream holds about window/quantum records.
	deliveries []delivery
}

type chunk struct {
	first uint64   // seq of the chunk's first event
	buf   []byte   // framed events back to back
	ends  []uint32 // ends[i]: end offset in buf of event first+i
	// pins counts the readers whose latest batch holds slices of buf (a
	// client write may be under way): a pinned chunk is never recycled.
	pins int32
}

type delivery struct {
	seq       uint64
	since, at int64 // unix nanos of the first and the latest delivery in the record
}

const (
	minChunk      = 512
	chunkOverhead = 64 // the chunk struct and its slot, counted with each chunk
	indexEntry    = 4  // bytes per event in a chunk's index
	minIndex      = 16 // index entries a chunk starts with
)

func newEventLog(epoch string, num uint32, maxChunk int) eventLog {
	var b [len("id: ") + eventid.MaxLen]byte
	id0 := eventid.Append(append(b[:0], "id: "...), epoch, num, 0)
	prefix := string(id0[:len(id0)-1]) // without the seq
	return eventLog{epoch: epoch, num: num, floor: 1, maxChunk: max(maxChunk, minChunk), idPrefix: prefix, digits: 1, pow10: 10}
}

func (c *chunk) last() uint64 { return c.first + uint64(len(c.ends)) - 1 }

func (c *chunk) capacity() int64 {
	return int64(cap(c.buf)) + int64(cap(c.ends))*indexEntry + chunkOverhead
}

// span returns the offsets of event seq in the chunk.
func (c *chunk) span(seq uint64) (start, end uint32) {
	i := seq - c.first
	if i > 0 {
		start = c.ends[i-1]
	}
	return start, c.ends[i]
}

// framedLen is the length of the next event framed around fields.
func (l *eventLog) framedLen(fields int) int {
	return len(l.idPrefix) + int(l.digits) + 1 + fields + 1
}

func decimalLen(v uint64) int {
	n := 1
	for v >= 10 {
		v /= 10
		n++
	}
	return n
}

// growth is how many bytes appending an event of n framed bytes adds to the
// log's size: a new chunk, or a larger index for the last one. exact asks
// for a new chunk of just the event's size (for signals, which bypass the
// bounds and must take no more than they need).
func (l *eventLog) growth(n int, exact bool) int64 {
	if c := l.lastChunk(); c != nil && len(c.buf)+n <= cap(c.buf) {
		if len(c.ends) < cap(c.ends) {
			return 0
		}
		return int64(cap(c.ends)) * indexEntry // the index doubles
	}
	return int64(l.nextChunkCap(n, exact)) + minIndex*indexEntry + chunkOverhead
}

// nextChunkCap sizes a new chunk: about a quarter of what the log holds, as
// a power of two between minChunk and maxChunk, so a busy stream gets few
// large chunks and a quiet one small chunks, wasting little either way; an
// event larger than that gets a chunk of exactly its size.
func (l *eventLog) nextChunkCap(n int, exact bool) int {
	if exact {
		return n
	}
	if l.fixedChunk > 0 {
		return max(l.fixedChunk, n)
	}
	want := max(int(l.live/4), minChunk)
	c := min(1<<bits.Len(uint(want-1)), l.maxChunk)
	return max(c, n)
}

func (l *eventLog) lastChunk() *chunk {
	if len(l.chunks) == 0 {
		return nil
	}
	return l.chunks[len(l.chunks)-1]
}

// needsChunk reports whether appending an event of n framed bytes takes a
// new chunk while the log holds others, whose front one might be recycled.
func (l *eventLog) needsChunk(n int) bool {
	last := l.lastChunk()
	return last != nil && len(last.buf)+n > cap(last.buf)
}

// recyclable reports whether the front chunk may take the next events once
// its own are gone: it is not the last, no reader holds slices of it, it
// fits the event, it is not much smaller than a new chunk would be (a ring
// of small chunks costs more per event), and not larger than chunks get
// unless the event is (an event-sized buffer must go with its event).
func (l *eventLog) recyclable(n int) bool {
	if len(l.chunks) < 2 {
		return false
	}
	c := l.chunks[0]
	size := cap(c.buf)
	return c.pins == 0 && size >= n && size <= max(l.maxChunk, 2*n) && 2*size >= l.nextChunkCap(n, false)
}

// recycle evicts the front chunk's events and makes the chunk, emptied, the
// last one, for the next events: a busy stream reuses its memory as a ring
// of chunks instead of allocating (and zeroing, and faulting in) a new one
// while the old goes to the garbage collector. The log's size is unchanged:
// the memory never leaves the stream's count. It returns the events evicted.
func (l *eventLog) recycle() uint64 {
	c := l.chunks[0]
	n := c.last() - l.floor + 1
	s, _ := c.span(l.floor)
	l.live -= int64(len(c.buf)) - int64(s)
	l.floor = c.last() + 1
	l.pruneDeliveries()
	// Rotate in place: the chunk list keeps its array.
	copy(l.chunks, l.chunks[1:])
	l.chunks[len(l.chunks)-1] = c
	c.first, c.buf, c.ends = l.head+1, c.buf[:0], c.ends[:0]
	return n
}

// append frames fields as event head+1 and returns its seq. The caller has
// reserved growth(framedLen(len(fields)), exact) bytes.
func (l *eventLog) append(fields []byte, exact bool) uint64 {
	n := l.framedLen(len(fields))
	c := l.lastChunk()
	if c == nil || len(c.buf)+n > cap(c.buf) {
		c = newChunk(l.nextChunkCap(n, exact))
		c.first = l.head + 1
		l.chunks = append(l.chunks, c)
		l.size += c.capacity()
	} else if len(c.ends) == cap(c.ends) {
		ends := make([]uint32, len(c.ends), 2*cap(c.ends))
		copy(ends, c.ends)
		l.size += int64(cap(c.ends)) * indexEntry
		c.ends = ends
	}
	l.head++
	if l.head+1 == l.pow10 {
		l.digits, l.pow10 = l.digits+1, l.pow10*10
	}
	c.buf = append(c.buf, l.idPrefix...)
	c.buf = strconv.AppendUint(c.buf, l.head, 10)
	c.buf = append(c.buf, '\n')
	c.buf = append(c.buf, fields...)
	c.buf = append(c.buf, '\n')
	c.ends = append(c.ends, uint32(len(c.buf)))
	l.live += int64(n)
	return l.head
}

// chunkOf returns the index in l.chunks of the chunk holding seq, which must
// be retained.
func (l *eventLog) chunkOf(seq uint64) int {
	return sort.Search(len(l.chunks), func(i int) bool { return l.chunks[i].last() >= seq })
}

// read appends to dst slices holding events from..to (retained, from <= to),
// at most maxBytes in all unless the first event alone is larger, and returns
// them with the last seq they hold. The slices alias the log: an event is
// never written again once appended, and a slice keeps its memory alive
// while a client write is under way even if the event is evicted meanwhile.
func (l *eventLog) read(dst [][]byte, from, to uint64, maxBytes int) ([][]byte, uint64) {
	dst, _, last := l.readPinned(dst, nil, false, from, to, maxBytes)
	return dst, last
}

// readPinned is read that, if pin, also pins the chunks it hands out slices
// of and appends them to pins, so they are not recycled while the reader
// writes them; the reader unpins them at its next read.
func (l *eventLog) readPinned(dst [][]byte, pins []*chunk, pin bool, from, to uint64, maxBytes int) ([][]byte, []*chunk, uint64) {
	last, total := from-1, 0
	for i := l.chunkOf(from); i < len(l.chunks) && last < to; i++ {
		c := l.chunks[i]
		first, stop := last+1, min(to, c.last())
		start, end := c.span(first)
		if total > 0 && total+int(end-start) > maxBytes {
			break
		}
		// The last event of first..stop that still fits; ends grow with seq.
		lo, hi := int(first-c.first), int(stop-c.first)
		budget := uint32(max(maxBytes-total, int(end-start)))
		k := lo + sort.Search(hi-lo+1, func(j int) bool { return c.ends[lo+j]-start > budget }) - 1
		end = c.ends[k]
		dst = append(dst, c.buf[start:end:end])
		if pin {
			c.pins++
			pins = append(pins, c)
		}
		total += int(end - start)
		last = c.first + uint64(k)
		if last < stop {
			break // maxBytes reached inside this chunk
		}
	}
	return dst, pins, last
}

// unpin releases the pins of a reader's previous batch.
func unpin(pins []*chunk) []*chunk {
	for i, c := range pins {
		c.pins--
		pins[i] = nil
	}
	return pins[:0]
}

// evict drops events floor..seq (seq at most head) and returns the capacity
// freed: that of the chunks whose events are all gone, which go back to the
// pool. When the log empties, its last chunk goes too, so a quiet stream
// gives its memory back.
func (l *eventLog) evict(seq uint64) int64 {
	return l.drop(seq, true)
}

// drop is evict; pool says whether the chunks freed go back to the pool.
func (l *eventLog) drop(seq uint64, pool bool) int64 {
	seq = min(seq, l.head)
	if seq < l.floor {
		return 0
	}
	for i := l.chunkOf(l.floor); i < len(l.chunks) && l.chunks[i].first <= seq; i++ {
		c := l.chunks[i]
		s, _ := c.span(max(l.floor, c.first))
		_, e := c.span(min(seq, c.last()))
		l.live -= int64(e - s)
	}
	var freed int64
	k := 0
	for k < len(l.chunks) && l.chunks[k].last() <= seq {
		freed += l.chunks[k].capacity()
		if pool {
			putChunk(l.chunks[k])
		}
		l.chunks[k] = nil
		k++
	}
	if k > 0 {
		l.chunks = l.chunks[k:]
		if cap(l.chunks) > 2*len(l.chunks)+8 {
			l.chunks = append([]*chunk(nil), l.chunks...) // let the old array go
		}
	}
	l.floor = seq + 1
	l.size -= freed
	l.pruneDeliveries()
	return freed
}

// evictable returns the highest seq that may leave the log now: events go in
// order while policy.Evictable allows, so the floor only moves up.
func (l *eventLog) evictable(acked, readerNext uint64, deleted bool, now time.Time, window time.Duration) uint64 {
	seq := l.floor - 1
	d := 0
	for seq < l.head {
		next := seq + 1
		for d < len(l.deliveries) && l.deliveries[d].seq < next {
			d++
		}
		v := policy.EventView{Seq: next, Acked: acked, ReaderNext: readerNext, SessionDeleted: deleted}
		if d < len(l.deliveries) {
			v.DeliveredAt = time.Unix(0, l.deliveries[d].at)
		}
		if !policy.Evictable(v, now, window) {
			break
		}
		seq = next
	}
	return seq
}

// deliveredAt is when seq was delivered (unix nanos), 0 if it was not.
func (l *eventLog) deliveredAt(seq uint64) int64 {
	for _, d := range l.deliveries {
		if d.seq >= seq {
			return d.at
		}
	}
	return 0
}

// evictableThrough reports whether events floor..seq (seq retained) may all
// leave the log now. Evictability only falls with seq (acks and deliveries
// come in order, and so does the reader), so policy need only be asked
// about seq itself.
func (l *eventLog) evictableThrough(seq, acked, readerNext uint64, now time.Time, window time.Duration) bool {
	v := policy.EventView{Seq: seq, Acked: acked, ReaderNext: readerNext}
	if d := sort.Search(len(l.deliveries), func(i int) bool { return l.deliveries[i].seq >= seq }); d < len(l.deliveries) {
		v.DeliveredAt = time.Unix(0, l.deliveries[d].at)
	}
	return policy.Evictable(v, now, window)
}

// delivered records that events up to seq were written and flushed at now.
func (l *eventLog) delivered(seq uint64, now int64, quantum time.Duration) {
	if n := len(l.deliveries); n > 0 {
		last := &l.deliveries[n-1]
		if seq <= last.seq {
			return
		}
		if now-last.since < int64(quantum) {
			last.seq, last.at = seq, now
			return
		}
	}
	l.deliveries = append(l.deliveries, delivery{seq: seq, since: now, at: now})
}

// undeliver forgets deliveries past seq: a client that resumes from seq says
// it holds nothing after it, whatever was written to an earlier connection.
func (l *eventLog) undeliver(seq uint64) {
	i := len(l.deliveries)
	for i > 0 && l.deliveries[i-1].seq > seq {
		i--
	}
	l.deliveries = l.deliveries[:i]
}

// pruneDeliveries drops records wholly below the floor.
func (l *eventLog) pruneDeliveries() {
	i := 0
	for i < len(l.deliveries) && l.deliveries[i].seq < l.floor {
		i++
	}
	if i > 0 {
		l.deliveries = append(l.deliveries[:0], l.deliveries[i:]...)
	}
}

// release drops everything (the session ended) and returns the capacity freed.
func (l *eventLog) release() int64 {
	freed := l.size
	for _, c := range l.chunks {
		putChunk(c)
	}
	l.chunks, l.deliveries = nil, nil
	l.floor, l.live, l.size = l.head+1, 0, 0
	return freed
}

// chunkPools keep the buffers of chunks that left their logs, by capacity
// (the powers of two chunks are sized to), for the next chunk of any log:
// a new chunk then costs neither zeroing its memory nor, once the runtime
// gave idle memory back to the system, faulting it in, and the garbage
// collector has less to do. A pool holds only what logs have freed since
// the last collections (sync.Pool drops what two collections found idle),
// so it never adds to what the bounds allow logs to hold; what the logs
// hold is counted exactly as before.
var chunkPools [8]sync.Pool // minChunk << 0..7

const maxPooledChunk = minChunk << 7 // 64 KiB: maxChunk never sizes chunks larger

// poolOf returns the pool for a chunk buffer of capacity n, nil if chunks
// of that capacity are not pooled (event-sized ones).
func poolOf(n int) *sync.Pool {
	if n < minChunk || n > maxPooledChunk || n&(n-1) != 0 {
		return nil
	}
	return &chunkPools[bits.Len(uint(n/minChunk))-1]
}

// newChunk returns an empty chunk whose buffer has capacity n, with an index
// of minIndex entries: its capacity() is the same whether it came from a
// pool or not, as growth() counted it. The buffer's old bytes are never
// read: a chunk's events are its first len(buf) bytes.
func newChunk(n int) *chunk {
	if p := poolOf(n); p != nil {
		if c, _ := p.Get().(*chunk); c != nil {
			if c.ends == nil {
				c.ends = make([]uint32, 0, minIndex)
			}
			return c
		}
	}
	return &chunk{buf: make([]byte, 0, n), ends: make([]uint32, 0, minIndex)}
}

// putChunk gives a chunk that left its log to the pool, unless a reader's
// batch holds slices of it (a client write may be under way: it is left to
// the garbage collector) or its size is not pooled.
func putChunk(c *chunk) {
	p := poolOf(cap(c.buf))
	if p == nil || c.pins > 0 {
		return
	}
	c.first, c.buf = 0, c.buf[:0]
	if cap(c.ends) == minIndex {
		c.ends = c.ends[:0]
	} else {
		c.ends = nil // an index that grew would count more than a new chunk's
	}
	p.Put(c)
}
