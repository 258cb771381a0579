package caddymodule

import (
	"testing"
	"time"
)

// drainingStore is a store module with a drain of its own.
type drainingStore struct{ MemoryStore }

func (drainingStore) DrainFor() time.Duration { return 3 * time.Second }

// A store module drains for as long as its Drainer says, and one without
// it for the default.
func TestDrainForAsksTheDrainer(t *testing.T) {
	if d := drainFor(MemoryStore{}); d != DefaultDrainTimeout {
		t.Errorf("memory store drains %v, want the default %v", d, DefaultDrainTimeout)
	}
	if d := drainFor(drainingStore{}); d != 3*time.Second {
		t.Errorf("a Drainer's drain is %v, want 3s", d)
	}
}
