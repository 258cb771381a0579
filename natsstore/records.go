package natsstore

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Records are what every replica knows of the zone, one JSON value per KV
// key. They are never modified in place: a write decodes a fresh copy,
// changes it, and compare-and-sets it.

// sessionRecord is one session (KV <P>_SESSIONS, key <sh>).
type sessionRecord struct {
	ID          string               `json:"id"`
	Epoch       string               `json:"epoch"`
	Version     string               `json:"version,omitempty"`
	Fingerprint []byte               `json:"fp,omitempty"`
	Bind        []string             `json:"bind,omitempty"`
	Credential  []byte               `json:"cred,omitempty"` // the bearer binding's token hash
	Principal   []byte               `json:"prn,omitempty"`  // and its principal's, when known
	Endpoint    string               `json:"ep,omitempty"`   // the path the session began on
	Origin      policy.SessionOrigin `json:"origin"`
	Confirmed   bool                 `json:"confirmed,omitempty"` // an Adopted session a resume has proved
	Created     int64                `json:"created"`             // unix nanos
	LastActive  int64                `json:"active"`
	NextStream  uint32               `json:"next"`
	Past        []buffer.Past        `json:"past,omitempty"` // earlier incarnations, newest first
}

// clone is a deep copy of r, for a write to change (mirror.update).
func (r *sessionRecord) clone() *sessionRecord {
	c := *r
	c.Fingerprint = bytes.Clone(r.Fingerprint)
	c.Bind = slices.Clone(r.Bind)
	c.Credential = bytes.Clone(r.Credential)
	c.Principal = bytes.Clone(r.Principal)
	if r.Past != nil {
		c.Past = make([]buffer.Past, len(r.Past))
		for i, p := range r.Past {
			c.Past[i] = p
			if p.Streams != nil {
				c.Past[i].Streams = make(map[uint32]policy.StreamView, len(p.Streams))
				for n, v := range p.Streams {
					v.Requests = slices.Clone(v.Requests)
					c.Past[i].Streams[n] = v
				}
			}
		}
	}
	return &c
}

// origin is the session's origin as admission counts it.
func (r *sessionRecord) origin() policy.SessionOrigin {
	if r.Origin == policy.Adopted && r.Confirmed {
		return policy.Resumed
	}
	return r.Origin
}

func (r *sessionRecord) meta() buffer.SessionMeta {
	m := buffer.SessionMeta{Version: r.Version, Bind: r.Bind, Endpoint: r.Endpoint, Origin: r.origin()}
	copy(m.Fingerprint[:], r.Fingerprint)
	copy(m.Credential.Hash[:], r.Credential)
	m.Credential.Principal.Known = copy(m.Credential.Principal.Hash[:], r.Principal) > 0
	return m
}

// setCredential records a bearer binding in the record.
func (r *sessionRecord) setCredential(c buffer.Credential) {
	r.Credential, r.Principal = nil, nil
	if c.Hash != ([32]byte{}) {
		r.Credential = append([]byte(nil), c.Hash[:]...)
	}
	if c.Principal.Known {
		r.Principal = append([]byte(nil), c.Principal.Hash[:]...)
	}
}

// streamRecord is one stream (KV <P>_STREAMS, key <sh>.<epoch>.<num>). Its
// producer writes answers, state and how far it has stored; readers write
// acknowledgements, deliveries and their position; whoever evicts writes
// the floor.
type streamRecord struct {
	Kind       policy.StreamKind    `json:"kind"`
	State      policy.StreamState   `json:"state"`
	FailReason policy.Reason        `json:"reason,omitempty"`
	Requests   []policy.RequestView `json:"reqs,omitempty"`
	Key        []byte               `json:"key,omitempty"` // identifies a request stream's request
	Floor      uint64               `json:"floor"`
	FloorOff   int64                `json:"floor_off"` // framed bytes of the events below Floor
	FloorMsg   uint64               `json:"floor_msg"` // a message sequence at or below the floor's message (search hint)
	Head       uint64               `json:"head"`      // as the producer last recorded it: exact once ended
	HeadOff    int64                `json:"head_off"`  // framed bytes of the events up to Head
	Synced     uint64               `json:"synced"`    // the message sequence up to which Head and answers are recorded
	Acked      uint64               `json:"acked"`
	Delivered  uint64               `json:"delivered"`
	Deliveries []delivery           `json:"dlv,omitempty"`
	Reader     *readerEntry         `json:"reader,omitempty"`
	Upstream   string               `json:"upstream,omitempty"`
	UpstreamAt uint64               `json:"upstream_at,omitempty"` // the stored head Upstream was recorded at
	Opened     bool                 `json:"opened,omitempty"`      // a client or producer used it (request streams: always)
	Purged     bool                 `json:"purged,omitempty"`      // ended, and nothing of it is stored any more (not even its end marker)
	Producer   string               `json:"producer,omitempty"`    // a request stream's: the replica that opened it or last took it over
	Created    int64                `json:"created"`
	Ended      int64                `json:"ended,omitempty"`
	// Tail is what eviction kept of a live request stream's last events
	// (their upstream IDs and sums, tail.go): for a takeover's repeat filter.
	Tail []tailEntry `json:"tail,omitempty"`
}

// clone is a deep copy of r, for a write to change (mirror.update): what
// decoding the stored value would give, without decoding it.
func (r *streamRecord) clone() *streamRecord {
	c := *r
	c.Requests = append([]policy.RequestView(nil), r.Requests...)
	c.Key = append([]byte(nil), r.Key...)
	c.Deliveries = append([]delivery(nil), r.Deliveries...)
	c.Tail = append([]tailEntry(nil), r.Tail...)
	if r.Reader != nil {
		e := *r.Reader
		c.Reader = &e
	}
	return &c
}

// readerEntry is the client connection attached to a stream, on whichever
// replica. Next is at most the reader's true position (it is written when
// the reader attaches and with its deliveries), so it never protects less
// than the reader still needs. At is refreshed while the reader lives; an
// entry older than the lease TTL is a reader whose replica died.
type readerEntry struct {
	ID      string `json:"id"`
	Replica string `json:"replica"`
	Next    uint64 `json:"next"`
	At      int64  `json:"at"`
}

// retained is what the stream holds against the byte bounds, by the
// record alone (a local producer knows more: see writer.retained).
func (r *streamRecord) retained() int64 { return max(r.HeadOff-r.FloorOff, 0) }

// readerAt returns the attached reader if it is alive at now.
func (r *streamRecord) readerAt(now time.Time, ttl time.Duration) *readerEntry {
	if r.Reader == nil || now.Sub(time.Unix(0, r.Reader.At)) >= ttl {
		return nil
	}
	return r.Reader
}

// view is the record as policy sees it, with head as given.
func (r *streamRecord) view(head uint64) policy.StreamView {
	return policy.StreamView{Kind: r.Kind, State: r.State, Floor: r.Floor, Head: max(head, r.Floor-1),
		Requests: append([]policy.RequestView(nil), r.Requests...)}
}

// answer records that seq answered request id (the first answer sticks).
func (r *streamRecord) answer(id string, seq uint64) {
	for i := range r.Requests {
		if r.Requests[i].ID == id && r.Requests[i].AnsweredAt == 0 {
			r.Requests[i].AnsweredAt = seq
		}
	}
}

// pending are the requests still waiting for their answer.
func (r *streamRecord) pending() []string {
	var out []string
	for _, q := range r.Requests {
		if q.AnsweredAt == 0 {
			out = append(out, q.ID)
		}
	}
	return out
}

// owed reports whether a client may lack an answer of this request stream:
// one is pending, or was sent after what the client acknowledged. It is
// what a tombstone remembers of the stream.
func (r *streamRecord) owed() (policy.StreamView, bool) {
	for _, q := range r.Requests {
		if q.AnsweredAt == 0 || q.AnsweredAt > r.Acked {
			v := r.view(r.Head)
			v.Floor = v.Head + 1 // nothing of it is retained any more
			return v, true
		}
	}
	return policy.StreamView{}, false
}

// tombRecord is an ended session (KV <P>_TOMBS, key <sh>).
type tombRecord struct {
	ID string `json:"id"`
	buffer.Tombstone
}

// leaseRecord names the replica that produces a stream (KV <P>_LEASES, key
// <sh>.<epoch>.<num>), or sweeps (KV <P>_META, key sweeper).
type leaseRecord struct {
	Replica string `json:"replica"`
	Since   int64  `json:"since"`
}

// ---- deliveries --------------------------------------------------------

// delivery records that every event up to Seq was written and flushed to a
// client, first at Since and last at At. Deliveries within one quantum share
// a record keeping the latest time, so an event is never taken for
// delivered earlier than it was (the memory store's log keeps the same).
type delivery struct {
	Seq   uint64 `json:"s"`
	Since int64  `json:"f"`
	At    int64  `json:"a"`
}

// delivered records that events up to seq were delivered at now.
func (r *streamRecord) delivered(seq uint64, now int64, quantum time.Duration) {
	if seq <= r.Delivered {
		return
	}
	r.Delivered = seq
	if n := len(r.Deliveries); n > 0 {
		last := &r.Deliveries[n-1]
		if now-last.Since < int64(quantum) {
			last.Seq, last.At = seq, now
			return
		}
	}
	r.Deliveries = append(r.Deliveries, delivery{Seq: seq, Since: now, At: now})
}

// ack records the client's position seq: it holds everything up to seq and
// nothing past it, whatever was written to an earlier connection.
func (r *streamRecord) ack(seq uint64) {
	r.Acked = max(r.Acked, seq)
	if r.Delivered > seq {
		i := len(r.Deliveries)
		for i > 0 && r.Deliveries[i-1].Seq > seq {
			i--
		}
		r.Deliveries = r.Deliveries[:i]
		r.Delivered = seq
	}
}

// lastDelivery is when a client last made progress on the stream.
func (r *streamRecord) lastDelivery() time.Time {
	if n := len(r.Deliveries); n > 0 {
		return time.Unix(0, r.Deliveries[n-1].At)
	}
	return time.Time{}
}

// evictable returns the highest seq that may leave the stream now, at most
// limit: events go in order while policy.Evictable allows. buffer's
// eventLog.evictable walks its own delivery list the same way; the rule
// both apply is policy's, the records they walk are each store's.
func (r *streamRecord) evictable(limit uint64, readerNext uint64, now time.Time, window time.Duration) uint64 {
	seq := r.Floor - 1
	d := 0
	for seq < limit {
		next := seq + 1
		for d < len(r.Deliveries) && r.Deliveries[d].Seq < next {
			d++
		}
		v := policy.EventView{Seq: next, Acked: r.Acked, ReaderNext: readerNext}
		if d < len(r.Deliveries) {
			v.DeliveredAt = time.Unix(0, r.Deliveries[d].At)
		}
		if !policy.Evictable(v, now, window) {
			break
		}
		seq = next
	}
	return seq
}

// moveFloor sets the floor (and what is known of the bytes below it),
// dropping deliveries wholly below it.
func (r *streamRecord) moveFloor(floor uint64, off int64, msg uint64) {
	r.Floor, r.FloorOff = floor, off
	r.FloorMsg = max(r.FloorMsg, msg)
	i := 0
	for i < len(r.Deliveries) && r.Deliveries[i].Seq < floor {
		i++
	}
	r.Deliveries = r.Deliveries[i:]
}

// ---- names -------------------------------------------------------------

// sessionToken is a session's subject token: session IDs may hold '.', '*'
// and '>', which subjects cannot.
func sessionToken(id string) string {
	h := sha256.Sum256([]byte(id))
	return hex.EncodeToString(h[:16])
}

// streamKey names a stream of one incarnation: <sh>.<epoch>.<num>. The epoch
// keeps a re-created session's streams apart from its predecessor's, even
// from a late write by a replica that has not yet seen the end.
func streamKey(sh, epoch string, num uint32) string {
	return sh + "." + epoch + "." + strconv.FormatUint(uint64(num), 10)
}

// splitStreamKey parses a stream key into its incarnation key (<sh>.<epoch>)
// and number.
func splitStreamKey(key string) (incarnation string, num uint32, ok bool) {
	i := strings.LastIndexByte(key, '.')
	if i < 0 {
		return "", 0, false
	}
	n, err := strconv.ParseUint(key[i+1:], 10, 32)
	if err != nil {
		return "", 0, false
	}
	return key[:i], uint32(n), true
}

// incarnationOf groups stream keys by incarnation for the mirror's index.
func incarnationOf(key string) string {
	inc, _, _ := splitStreamKey(key)
	return inc
}
