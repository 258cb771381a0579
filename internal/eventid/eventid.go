// Package eventid mints and parses the proxy's SSE event IDs.
//
// An ID is "<epoch>-<stream>-<seq>", for example "k3j9x2qa-3-17":
//   - epoch: 8 characters from [a-z2-7], minted per session incarnation. It
//     carries a nonce and a keyed MAC of (session ID, nonce), so the proxy
//     can tell an epoch it minted for that session (now or in an earlier
//     incarnation, before a restart, expiry or purge) from a foreign or
//     made-up one, without remembering anything;
//   - stream: 0 for the session's standalone GET stream, 1, 2, … for the
//     streams of POST requests, in order;
//   - seq: the event's position in its stream, contiguous from 1; 0 is the
//     position before the first event (the priming event's ID).
//
// IDs are canonical (no leading zeros), so two IDs are equal exactly when their
// strings are. They contain no "_" (upstream SDKs split their own IDs on it),
// no CR/LF and nothing outside ASCII.
package eventid

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"slices"
	"strconv"
)

// EpochLen is the length of an epoch: 40 bits in base32, of which
// nonceBits tell incarnations of one session apart and the rest are the MAC.
const EpochLen = 8

const (
	nonceBits = 12
	macBits   = 5*EpochLen - nonceBits // 28: a forged epoch passes 1 time in 2^28
)

// Standalone is the stream number of a session's standalone GET stream.
const Standalone uint32 = 0

// MaxLen bounds the length of a valid ID: epoch, stream (uint32), seq (uint64)
// and two dashes. Longer input is rejected before any parsing work.
const MaxLen = EpochLen + 1 + 10 + 1 + 20

const epochAlphabet = "abcdefghijklmnopqrstuvwxyz234567"

// ErrMalformed is returned by Parse for anything that is not a canonical ID.
var ErrMalformed = errors.New("malformed event id")

// ID is a parsed event ID.
type ID struct {
	Epoch  string
	Stream uint32
	Seq    uint64
}

// NewEpoch mints an epoch for a new incarnation of session sid, under key,
// other than any of past (the epochs of its earlier incarnations still
// remembered). An epoch names one incarnation: a new one drawn equal to an
// old one would take the old one's cursors, and the requests authorized
// against it, for its own (with 12 bits of nonce, one re-creation in 4096).
func NewEpoch(key []byte, sid string, past ...string) string {
	var b [2]byte
	rand.Read(b[:]) // never fails (crypto/rand panics instead since Go 1.24)
	nonce := uint64(binary.BigEndian.Uint16(b[:])) & (1<<nonceBits - 1)
	epoch := encode(nonce<<macBits | mac(key, sid, nonce))
	for i := 0; i < 1<<nonceBits && slices.Contains(past, epoch); i++ {
		nonce = (nonce + 1) & (1<<nonceBits - 1)
		epoch = encode(nonce<<macBits | mac(key, sid, nonce))
	}
	return epoch
}

// Minted reports whether epoch was minted by NewEpoch for sid under key.
func Minted(key []byte, sid, epoch string) bool {
	v, ok := decode(epoch)
	if !ok {
		return false
	}
	nonce := v >> macBits
	return hmac.Equal(binary.BigEndian.AppendUint64(nil, v&(1<<macBits-1)),
		binary.BigEndian.AppendUint64(nil, mac(key, sid, nonce)))
}

func mac(key []byte, sid string, nonce uint64) uint64 {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("mcp-resume epoch\x00"))
	m.Write([]byte(sid))
	m.Write(binary.BigEndian.AppendUint16(nil, uint16(nonce)))
	return binary.BigEndian.Uint64(m.Sum(nil)) & (1<<macBits - 1)
}

func encode(v uint64) string {
	var b [EpochLen]byte
	for i := EpochLen - 1; i >= 0; i-- {
		b[i] = epochAlphabet[v&31]
		v >>= 5
	}
	return string(b[:])
}

func decode(s string) (uint64, bool) {
	if len(s) != EpochLen {
		return 0, false
	}
	var v uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z':
			v = v<<5 | uint64(c-'a')
		case c >= '2' && c <= '7':
			v = v<<5 | uint64(c-'2'+26)
		default:
			return 0, false
		}
	}
	return v, true
}

// ValidEpoch reports whether s has the shape of an epoch.
func ValidEpoch(s string) bool {
	_, ok := decode(s)
	return ok
}

// String formats the ID.
func (id ID) String() string { return string(id.Append(make([]byte, 0, 32))) }

// Append appends the formatted ID to dst.
func (id ID) Append(dst []byte) []byte {
	return Append(dst, id.Epoch, id.Stream, id.Seq)
}

// Append appends the ID of (epoch, stream, seq) to dst without allocating.
func Append(dst []byte, epoch string, stream uint32, seq uint64) []byte {
	dst = append(dst, epoch...)
	dst = append(dst, '-')
	dst = strconv.AppendUint(dst, uint64(stream), 10)
	dst = append(dst, '-')
	return strconv.AppendUint(dst, seq, 10)
}

// Len is the length of the ID Append writes for an epoch of epochLen
// bytes, stream and seq, without writing it.
func Len(epochLen int, stream uint32, seq uint64) int {
	var b [20]byte
	return epochLen + 1 + len(strconv.AppendUint(b[:0], uint64(stream), 10)) + 1 + len(strconv.AppendUint(b[:0], seq, 10))
}

// Parse parses a canonical ID.
func Parse(s string) (ID, error) {
	if len(s) > MaxLen || len(s) < EpochLen+4 || s[EpochLen] != '-' || !ValidEpoch(s[:EpochLen]) {
		return ID{}, ErrMalformed
	}
	rest := s[EpochLen+1:]
	dash := -1
	for i := 0; i < len(rest); i++ {
		if rest[i] == '-' {
			dash = i
			break
		}
	}
	if dash < 0 {
		return ID{}, ErrMalformed
	}
	stream, ok := parseCanonical(rest[:dash], 32)
	if !ok {
		return ID{}, ErrMalformed
	}
	seq, ok := parseCanonical(rest[dash+1:], 64)
	if !ok {
		return ID{}, ErrMalformed
	}
	return ID{Epoch: s[:EpochLen], Stream: uint32(stream), Seq: seq}, nil
}

// parseCanonical parses a decimal number with no sign and no leading zeros.
func parseCanonical(s string, bits int) (uint64, bool) {
	if s == "" || len(s) > 1 && s[0] == '0' {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseUint(s, 10, bits)
	return n, err == nil
}
