package natsstore

import "testing"

// A lease key's last holder, as a taker sees it: one that released it
// (a delete) is no one's; one whose lease lapsed (its TTL's expiry marker,
// or still there as far as the mirror saw) is the holder that may still
// have its upstream response open.
func TestMirrorUnreleased(t *testing.T) {
	m := newMirror[leaseRecord](nil, nil, nil)
	if m.unreleased("k") != nil {
		t.Fatal("an unknown key has a holder")
	}
	a := &leaseRecord{Replica: "a"}
	m.apply("k", 1, []byte(`{"replica":"a"}`), a)
	if got := m.unreleased("k"); got != a {
		t.Fatalf("a held key: %v, want its holder", got)
	}
	m.applyAs("k", 2, nil, nil, true) // expired
	if got := m.unreleased("k"); got != a {
		t.Fatalf("an expired lease: %v, want its last holder", got)
	}
	b := &leaseRecord{Replica: "b"}
	m.apply("k", 3, []byte(`{"replica":"b"}`), b)
	m.apply("k", 4, nil, nil) // released
	if got := m.unreleased("k"); got != nil {
		t.Fatalf("a released lease: %v, want none", got)
	}
	m.apply("k", 5, []byte(`{"replica":"a"}`), a)
	m.applyAs("k", 5, nil, nil, true) // a late marker of an older revision changes nothing
	if got := m.unreleased("k"); got != a {
		t.Fatalf("got %v, want the holder", got)
	}
}
