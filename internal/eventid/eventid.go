// Package eventid mints and parses the proxy's SSE event IDs.
//
// An ID is "<epoch>-<stream>-<seq>", for example "k3j9x2qa-3-17":
//   - epoch: 8 random characters from [a-z2-7], minted per session, so an ID of
//     another session (or of a session the proxy has forgotten) is recognisably foreign;
//   - stream: the stream's number within the session, from 1;
//   - seq: the event's position in its stream, contiguous from 1; 0 is the
//     position before the first event (the priming event's ID).
//
// IDs are canonical (no leading zeros), so two IDs are equal exactly when their
// strings are. They contain no "_" (upstream SDKs split their own IDs on it),
// no CR/LF and nothing outside ASCII.
package eventid

import (
	"crypto/rand"
	"errors"
	"strconv"
)

// EpochLen is the length of an epoch.
const EpochLen = 8

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

// NewEpoch returns a fresh random epoch (40 bits of entropy).
func NewEpoch() string {
	var b [EpochLen]byte
	rand.Read(b[:]) // never fails (crypto/rand panics instead since Go 1.24)
	for i := range b {
		b[i] = epochAlphabet[b[i]&31]
	}
	return string(b[:])
}

// ValidEpoch reports whether s has the shape of an epoch.
func ValidEpoch(s string) bool {
	if len(s) != EpochLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7') {
			return false
		}
	}
	return true
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

// Parse parses a canonical ID. Stream 0 is not a valid stream.
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
	if !ok || stream == 0 {
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
