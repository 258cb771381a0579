package eventid

import (
	"math"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	for _, id := range []ID{
		{"k3j7x2qa", 3, 17},
		{"aaaaaaaa", 1, 0},
		{"77777777", 1, 1},
		{"abcdefgh", math.MaxUint32, math.MaxUint64},
		{NewEpoch([]byte("k"), "s"), 42, 1 << 40},
		{"k3j7x2qa", Standalone, 5},
	} {
		s := id.String()
		if strings.ContainsAny(s, "_\r\n") {
			t.Errorf("%q contains a forbidden byte", s)
		}
		if len(s) > MaxLen {
			t.Errorf("%q is longer than MaxLen %d", s, MaxLen)
		}
		got, err := Parse(s)
		if err != nil {
			t.Errorf("Parse(%q): %v", s, err)
			continue
		}
		if got != id {
			t.Errorf("Parse(%q) = %+v, want %+v", s, got, id)
		}
		if b := Append([]byte("x"), id.Epoch, id.Stream, id.Seq); string(b) != "x"+s {
			t.Errorf("Append = %q, want %q", b, "x"+s)
		}
	}
	if got := (ID{"k3j7x2qa", 3, 17}).String(); got != "k3j7x2qa-3-17" {
		t.Errorf("String = %q", got)
	}
}

func TestParseRejects(t *testing.T) {
	for _, s := range []string{
		"",
		"-",
		"k3j7x2qa",
		"k3j7x2qa-",
		"k3j7x2qa-3",
		"k3j7x2qa-3-",
		"k3j7x2qa--17",
		"k3j7x2qa-3-17" + strings.Repeat("0", MaxLen),                    // too long
		"k3j7x2qa-1-" + strings.Repeat("1", MaxLen-len("k3j7x2qa-1-")+1), // one over MaxLen
		"K3J9X2QA-3-17",                   // uppercase epoch
		"k3j7x2qA-3-17",                   // one uppercase letter
		"k3j7x2q1-3-17",                   // '1' is not in the alphabet
		"k3j7x2q8-3-17",                   // nor '8'
		"k3j7x2q-3-17",                    // short epoch
		"k3j7x2qaa-3-17",                  // long epoch
		"k3j7x2qa-03-17",                  // leading zero in stream
		"k3j7x2qa-3-017",                  // leading zero in seq
		"k3j7x2qa-3-00",                   // zero written twice
		"k3j7x2qa-00-17",                  // stream 0 written twice
		"k3j7x2qa-4294967296-1",           // stream overflows uint32
		"k3j7x2qa-1-18446744073709551616", // seq overflows uint64
		"k3j7x2qa-1-99999999999999999999", // 20 digits, overflows
		"k3j7x2qa-3-17-1",                 // extra dash
		"k3j7x2qa-3--17",                  // double dash
		"k3j7x2qa-3-17-",                  // trailing dash
		"-k3j7x2qa-3-17",                  // leading dash
		"k3j7x2qa-3-17\n",                 // LF
		"k3j7x2qa-3-17\r",                 // CR
		"k3j7x2qa-3\r\n-17",               // CRLF inside
		"k3j7x2qa-3-1é",                   // non-ASCII
		"k3j7x2qé-3-17",                   // non-ASCII epoch
		"k3j7x2qa-３-17",                   // fullwidth digit
		"k3j7x2qa_3_17",                   // underscores
		"k3j7x2qa-3_17",
		"k3j7x2qa-+3-17", // sign
		"k3j7x2qa-3-+17",
		"k3j7x2qa-3--1",
		"k3j7x2qa- 3-17", // space
		"k3j7x2qa-3-17 ",
		"k3j7x2qa-0x1-17",
		"k3j7x2qa-3-1e3",
	} {
		if id, err := Parse(s); err == nil {
			t.Errorf("Parse(%q) = %+v, want an error", s, id)
		} else if err != ErrMalformed {
			t.Errorf("Parse(%q) error = %v, want ErrMalformed", s, err)
		}
	}
}

func TestMaxLenIsReachable(t *testing.T) {
	s := ID{"abcdefgh", math.MaxUint32, math.MaxUint64}.String()
	if len(s) != MaxLen {
		t.Errorf("longest ID %q has length %d, MaxLen is %d", s, len(s), MaxLen)
	}
}

func TestLen(t *testing.T) {
	for _, stream := range []uint32{0, 1, 9, 10, 99, 100, math.MaxUint32} {
		for _, seq := range []uint64{0, 1, 9, 10, 12345, math.MaxUint64} {
			if got, want := Len(EpochLen, stream, seq), len(Append(nil, "abcdefgh", stream, seq)); got != want {
				t.Fatalf("Len(%d, %d) = %d, Append wrote %d bytes", stream, seq, got, want)
			}
		}
	}
}

func TestNewEpoch(t *testing.T) {
	key := []byte("zone key")
	seen := make(map[string]bool)
	for i := 0; i < 1000; i++ {
		e := NewEpoch(key, "session-1")
		if !ValidEpoch(e) {
			t.Fatalf("NewEpoch() = %q is not a valid epoch", e)
		}
		if _, err := Parse(e + "-1-0"); err != nil {
			t.Fatalf("Parse(%q): %v", e+"-1-0", err)
		}
		seen[e] = true
	}
	// 12 bits of nonce tell incarnations apart: 1000 draws from 4096 give
	// about 890 distinct values.
	if len(seen) < 800 {
		t.Errorf("only %d distinct epochs in 1000 draws", len(seen))
	}
	for _, bad := range []string{"", "abc", "abcdefgh1", "abcdefg1", "ABCDEFGH", "abcdefg-"} {
		if ValidEpoch(bad) {
			t.Errorf("ValidEpoch(%q) = true", bad)
		}
	}
}

// An epoch verifies only for the session ID and key it was minted for, so
// the proxy can tell its own (earlier) epochs of a session from made-up ones
// without remembering them.
func TestMinted(t *testing.T) {
	key := []byte("zone key")
	e := NewEpoch(key, "session-1")
	if !Minted(key, "session-1", e) {
		t.Fatalf("Minted(%q) = false for its own session", e)
	}
	for _, c := range []struct{ key, sid, epoch string }{
		{"zone key", "session-2", e},
		{"other key", "session-1", e},
		{"zone key", "session-1", "aaaaaaaa"},
		{"zone key", "session-1", "ABCDEFGH"},
		{"zone key", "session-1", ""},
	} {
		if Minted([]byte(c.key), c.sid, c.epoch) {
			t.Errorf("Minted(%q, %q, %q) = true", c.key, c.sid, c.epoch)
		}
	}
	// Guessing: about 1 in 2^28 made-up epochs passes.
	forged := 0
	for i := 0; i < 100000; i++ {
		if Minted(key, "session-1", encode(uint64(i)*2654435761%(1<<40))) {
			forged++
		}
	}
	if forged > 1 {
		t.Errorf("%d of 100000 made-up epochs verified", forged)
	}
}

// FuzzParse: whatever parses is canonical (formats back to the same string)
// and is free of the bytes IDs must never contain.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"k3j7x2qa-3-17", "aaaaaaaa-1-0", "k3j7x2qa-03-17", "k3j7x2qa-4294967295-18446744073709551615", "x_y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := Parse(s)
		if err != nil {
			if id != (ID{}) {
				t.Fatalf("Parse(%q) failed but returned %+v", s, id)
			}
			return
		}
		if got := id.String(); got != s {
			t.Fatalf("Parse(%q) = %+v, which formats as %q", s, id, got)
		}
		if !ValidEpoch(id.Epoch) || len(s) > MaxLen || strings.ContainsAny(s, "_\r\n") {
			t.Fatalf("Parse(%q) accepted an invalid ID %+v", s, id)
		}
		for i := 0; i < len(s); i++ {
			if s[i] >= 0x80 {
				t.Fatalf("Parse(%q) accepted non-ASCII", s)
			}
		}
	})
}
