package caddymodule

import (
	"fmt"
	"testing"
)

// Every event in every phase a zone can be in, for both kinds of store:
// the legal transitions as listed, every other one refused with nothing
// done.
func TestZoneLifecycleTransitions(t *testing.T) {
	var (
		unopened       = zonePhase{state: zoneUnopened}
		connecting     = zonePhase{state: zoneConnecting}
		serving        = zonePhase{state: zoneServing}
		drainingReload = zonePhase{state: zoneDrainingReload, released: true}
		drainingExit   = zonePhase{state: zoneDrainingExit}
		drainingExitR  = zonePhase{state: zoneDrainingExit, released: true}
		drainingRel    = zonePhase{state: zoneDrainingRelease, released: true}
		stopped        = zonePhase{state: zoneStopped}
		closed         = zonePhase{state: zoneClosed, released: true}
	)
	phases := []zonePhase{unopened, connecting, serving, drainingReload, drainingExit, drainingExitR, drainingRel, stopped, closed}
	const (
		both = iota
		sharedOnly
		memoryOnly
	)
	type row struct {
		from  zonePhase
		ev    zoneEvent
		store int
		to    zonePhase
		act   zoneAction
	}
	rows := []row{
		// Opening: once; every later start of a configuration says it again.
		{unopened, zoneOpen, both, connecting, actConnect},
		{connecting, zoneOpen, both, connecting, 0},
		{serving, zoneOpen, both, serving, 0},
		{drainingReload, zoneOpen, both, drainingReload, 0},
		{drainingExit, zoneOpen, both, drainingExit, 0},
		{drainingExitR, zoneOpen, both, drainingExitR, 0},
		{drainingRel, zoneOpen, both, drainingRel, 0},
		{stopped, zoneOpen, both, stopped, 0},
		{closed, zoneOpen, both, closed, 0},

		// The store opens: it serves, even while the process stops (it is
		// closed with the zone); after the zone closed it is closed at once.
		{connecting, zoneConnected, both, serving, actKeepStore},
		{drainingReload, zoneConnected, both, drainingReload, actKeepStore},
		{drainingExit, zoneConnected, both, drainingExit, actKeepStore},
		{drainingExitR, zoneConnected, both, drainingExitR, actKeepStore},
		{drainingRel, zoneConnected, both, drainingRel, actKeepStore},
		{stopped, zoneConnected, both, stopped, actKeepStore},
		{closed, zoneConnected, both, closed, actDiscardStore},

		// Exit: a shared store drains within drain_timeout, the memory
		// store's reads end at once; a reload's drain gets its bound (a
		// release's has it already).
		{unopened, zoneExit, both, stopped, actStop},
		{connecting, zoneExit, sharedOnly, drainingExit, actDrain | actBound},
		{serving, zoneExit, sharedOnly, drainingExit, actDrain | actBound},
		{connecting, zoneExit, memoryOnly, stopped, actStop},
		{serving, zoneExit, memoryOnly, stopped, actStop},
		{drainingReload, zoneExit, both, drainingExitR, actBound},
		{drainingExit, zoneExit, both, drainingExit, 0},
		{drainingExitR, zoneExit, both, drainingExitR, 0},
		{drainingRel, zoneExit, both, drainingRel, 0},
		{stopped, zoneExit, both, stopped, 0},
		{closed, zoneExit, both, closed, 0},

		// Released while the process goes on, no successor (a reload
		// renamed the zone or took mcp_resume off): any store drains within
		// drain_timeout, so the running calls are not cut; with nothing
		// running (unopened, stopped) closed now.
		{unopened, zoneReleased, both, closed, actStop | actClose},
		{connecting, zoneReleased, both, drainingRel, actDrain | actBound},
		{serving, zoneReleased, both, drainingRel, actDrain | actBound},
		{stopped, zoneReleased, both, closed, actStop | actClose},

		// Replaced by a reload to another store: a shared store drains
		// with no bound; the memory store's content cannot move: closed.
		{connecting, zoneReplaced, sharedOnly, drainingReload, actDrain},
		{serving, zoneReplaced, sharedOnly, drainingReload, actDrain},
		{connecting, zoneReplaced, memoryOnly, closed, actStop | actClose},
		{serving, zoneReplaced, memoryOnly, closed, actStop | actClose},
		{unopened, zoneReplaced, both, closed, actStop | actClose},

		// Released on exit: a drain under way closes the zone when it is
		// over; one not started yet starts, bounded.
		{unopened, zoneReleasedOnExit, both, closed, actStop | actClose},
		{connecting, zoneReleasedOnExit, sharedOnly, drainingExitR, actDrain | actBound},
		{serving, zoneReleasedOnExit, sharedOnly, drainingExitR, actDrain | actBound},
		{connecting, zoneReleasedOnExit, memoryOnly, closed, actStop | actClose},
		{serving, zoneReleasedOnExit, memoryOnly, closed, actStop | actClose},
		{drainingExit, zoneReleasedOnExit, both, drainingExitR, 0},
		{stopped, zoneReleasedOnExit, both, closed, actStop | actClose},

		// Drained: reads are cut; the store closes once no configuration
		// holds the zone.
		{drainingReload, zoneDrained, both, closed, actStop | actClose},
		{drainingExit, zoneDrained, both, stopped, actStop},
		{drainingExitR, zoneDrained, both, closed, actStop | actClose},
		{drainingRel, zoneDrained, both, closed, actStop | actClose},
	}
	type key struct {
		from   zonePhase
		ev     zoneEvent
		shared bool
	}
	legal := map[key]row{}
	for _, r := range rows {
		for _, shared := range []bool{true, false} {
			if r.store == sharedOnly && !shared || r.store == memoryOnly && shared {
				continue
			}
			k := key{r.from, r.ev, shared}
			if _, dup := legal[k]; dup {
				t.Fatalf("row listed twice: %+v", r)
			}
			legal[k] = r
		}
	}
	for _, p := range phases {
		for ev := zoneOpen; ev <= zoneDrained; ev++ {
			for _, shared := range []bool{true, false} {
				name := fmt.Sprintf("%s/released=%v/%s/shared=%v", p.state, p.released, ev, shared)
				next, act, ok := step(p, ev, shared)
				r, isLegal := legal[key{p, ev, shared}]
				switch {
				case isLegal && (!ok || next != r.to || act != r.act):
					t.Errorf("%s: got %s released=%v %s ok=%v, want %s released=%v %s",
						name, next.state, next.released, act, ok, r.to.state, r.to.released, r.act)
				case !isLegal && (ok || next != p || act != 0):
					t.Errorf("%s: an impossible event was taken: %s released=%v %s ok=%v",
						name, next.state, next.released, act, ok)
				}
			}
		}
	}
}

// From every phase a zone reaches, the events that end a process or a
// configuration lead to closed, so no store is left open.
func TestZoneLifecycleEndsClosed(t *testing.T) {
	for _, shared := range []bool{true, false} {
		for _, path := range [][]zoneEvent{
			{zoneOpen, zoneConnected, zoneExit, zoneDrained, zoneReleasedOnExit},
			{zoneOpen, zoneConnected, zoneExit, zoneReleasedOnExit, zoneDrained},
			{zoneOpen, zoneConnected, zoneReleasedOnExit, zoneDrained},
			{zoneOpen, zoneConnected, zoneReplaced, zoneExit, zoneDrained},
			{zoneOpen, zoneConnected, zoneReplaced, zoneDrained},
			{zoneOpen, zoneReplaced, zoneDrained, zoneConnected},
			{zoneOpen, zoneConnected, zoneReleased, zoneDrained},
			{zoneOpen, zoneConnected, zoneReleased, zoneExit, zoneDrained},
			{zoneOpen, zoneReleased, zoneDrained, zoneConnected},
			{zoneReleased},
			{zoneExit, zoneReleasedOnExit},
		} {
			p := zonePhase{}
			for _, ev := range path {
				next, _, ok := step(p, ev, shared)
				if !ok {
					if shared || ev != zoneDrained { // a memory zone never drains: the path ends where it closed
						t.Errorf("shared=%v %v: %s refused in %s", shared, path, ev, p.state)
					}
					continue
				}
				p = next
			}
			if p.state != zoneClosed {
				t.Errorf("shared=%v %v: ends %s", shared, path, p.state)
			}
		}
	}
}

func TestZoneLifecycleNames(t *testing.T) {
	if s := zoneDrainingExit.String(); s != "draining_exit" {
		t.Errorf("state name %q", s)
	}
	if s := zoneDrainingRelease.String(); s != "draining_release" {
		t.Errorf("state name %q", s)
	}
	if s := zoneClosed.String(); s != "closed" {
		t.Errorf("state name %q", s)
	}
	if s := zoneState(99).String(); s != "zoneState(99)" {
		t.Errorf("unknown state %q", s)
	}
	if s := zoneReleasedOnExit.String(); s != "released_on_exit" {
		t.Errorf("event name %q", s)
	}
	if s := (actStop | actClose).String(); s != "stop+close" {
		t.Errorf("actions %q", s)
	}
	if s := zoneAction(0).String(); s != "none" {
		t.Errorf("no action %q", s)
	}
}
