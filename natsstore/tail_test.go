package natsstore

import (
	"slices"
	"strings"
	"testing"
)

// Mcpr-Ids round-trips any IDs an SSE id line can carry, no ID included,
// and a message holding one event that came with its cursor's ID (a short
// call's usual message) goes without it.
func TestUpstreamIDsHeader(t *testing.T) {
	for _, ids := range [][]string{{"a"}, {""}, {"a", "", "b"}, {"x,y", " lead", "trail ", "50%", "%00", "é", "\t"}} {
		v := joinIDs(ids)
		if v == "" {
			t.Fatalf("%q encodes empty", ids)
		}
		got, err := splitIDs(v, len(ids))
		if err != nil || !slices.Equal(got, ids) {
			t.Fatalf("%q -> %q -> %q, %v", ids, v, got, err)
		}
	}
	long := strings.Repeat("i", maxTailID+1)
	if got, err := splitIDs(joinIDs([]string{"a", long}), 2); err != nil || !slices.Equal(got, []string{"a", ""}) {
		t.Fatalf("an ID past maxTailID: %q, %v; want it recorded as none", got, err)
	}
	if _, err := splitIDs("a,b", 3); err == nil {
		t.Fatal("a count mismatch decoded")
	}
	if _, err := splitIDs("a%4", 1); err == nil {
		t.Fatal("a torn escape decoded")
	}

	one := batch{lens: []int{10}, ups: []string{"u1"}, own: []string{"u1"}, upstream: "u1"}
	if m := one.msg("s"); m.Header.Get(hdrIDs) != "" {
		t.Fatalf("one event under its own cursor carries %s: %q", hdrIDs, m.Header.Get(hdrIDs))
	}
	for _, b := range []batch{
		{lens: []int{10}, ups: []string{"p1"}, own: []string{"u1"}, upstream: "p1"}, // a note after it
		{lens: []int{10}, ups: []string{"u0"}, own: []string{""}, upstream: "u0"},   // no ID of its own
		{lens: []int{10, 10}, ups: []string{"u1", "u2"}, own: []string{"u1", "u2"}, upstream: "u2"},
	} {
		m := b.msg("s")
		info, err := parseMsg(1, m.Header, make([]byte, 10*len(b.lens)))
		if err != nil {
			t.Fatal(err)
		}
		if info.first, info.off = b.first, b.off; !slices.Equal(info.ownIDs(), b.own) {
			t.Fatalf("%+v: own IDs read back %q", b, info.ownIDs())
		}
	}
	if got := (&msgInfo{size: 5, upstream: "u1"}).ownIDs(); !slices.Equal(got, []string{"u1"}) {
		t.Fatalf("a message without %s: %q", hdrIDs, got)
	}
}
