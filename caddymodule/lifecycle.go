package caddymodule

import "fmt"

// A zone's life, as states, events and the actions a transition takes:
// step is the whole of it, a pure function; zone.go runs the actions.
//
//	unopened ──open──▶ connecting ──connected──▶ serving
//	shared store:
//	  connecting, serving ──exit──▶ draining_exit ──drained──▶ stopped ──released on exit──▶ closed
//	  connecting, serving ──released on exit──▶ draining_exit, released ──drained──▶ closed
//	  draining_exit ──released on exit──▶ draining_exit, released
//	  connecting, serving ──replaced──▶ draining_reload ──drained──▶ closed
//	  draining_reload ──exit──▶ draining_exit, released (the drain gets its bound)
//	memory store: connecting, serving ──exit──▶ stopped; ──replaced, released on exit──▶ closed
//	both stores:
//	  connecting, serving ──released──▶ draining_release ──drained──▶ closed
//	  draining_release ──exit──▶ draining_release (bounded already)
//	unopened ──exit──▶ stopped; unopened, stopped ──released──▶ closed
//	closed ──connected──▶ closed (the late store is closed)
//
// A shared store drains: new calls get 503 while the running ones read on
// into the store, so their results are there on another replica. On exit
// the drain gives up after drain_timeout; after a reload that moved the
// handlers to another store it has no bound (every call ends by itself)
// until the process exits. A reload that leaves no handler in the zone at
// all (it renamed the zone, or took mcp_resume off) drains it too, on
// either store, within drain_timeout: as plain reverse_proxy lets a
// request in flight finish, a call goes on to its end, on the connection
// its client has, or into the shared store; a memory store's content has
// nowhere to go, but its running calls need not be cut.

// zoneState is where a zone is in its life.
type zoneState uint8

const (
	zoneUnopened        zoneState = iota // provisioned: a shared store connects once Caddy runs the configuration
	zoneConnecting                       // the store is opening (a shared one retries); requests that need it get 503
	zoneServing                          // the store is open
	zoneDrainingReload                   // a reload moved the handlers to another store; running calls end into this one
	zoneDrainingExit                     // the process is stopping; running calls end into the store within drain_timeout
	zoneDrainingRelease                  // a reload left no handler in the zone; running calls end within drain_timeout
	zoneStopped                          // reads and relays are cut; the store closes when no configuration holds the zone
	zoneClosed                           // the store is closed
)

var zoneStateNames = [...]string{"unopened", "connecting", "serving", "draining_reload", "draining_exit", "draining_release", "stopped", "closed"}

func (s zoneState) String() string {
	if int(s) < len(zoneStateNames) {
		return zoneStateNames[s]
	}
	return fmt.Sprintf("zoneState(%d)", s)
}

// zoneEvent is what happens to a zone.
type zoneEvent uint8

const (
	zoneOpen           zoneEvent = iota // a configuration holding the zone started (the memory store: at once)
	zoneConnected                       // the store opened
	zoneExit                            // the process is stopping
	zoneReleased                        // no configuration holds the zone, none replaces it, the process goes on
	zoneReplaced                        // a reload moved the zone's handlers to another store of the same name
	zoneReleasedOnExit                  // no configuration holds the zone: the process is exiting
	zoneDrained                         // the drain is over: no running call left, or its bound passed
)

var zoneEventNames = [...]string{"open", "connected", "exit", "released", "replaced", "released_on_exit", "drained"}

func (e zoneEvent) String() string {
	if int(e) < len(zoneEventNames) {
		return zoneEventNames[e]
	}
	return fmt.Sprintf("zoneEvent(%d)", e)
}

// zoneAction is what a transition does, in this order.
type zoneAction uint8

const (
	actConnect      zoneAction = 1 << iota // open the store (a shared one in the background, until it connects)
	actKeepStore                           // the store that opened serves the zone
	actDiscardStore                        // the store opened after the zone closed: close it
	actDrain                               // refuse new calls, wait for the running ones, then drained
	actBound                               // the drain gives up on running calls drain_timeout from now
	actStop                                // cut every upstream read and relay
	actClose                               // close the store (once its taps have closed)
)

var zoneActionNames = [...]string{"connect", "keep_store", "discard_store", "drain", "bound", "stop", "close"}

func (a zoneAction) String() string {
	if a == 0 {
		return "none"
	}
	s := ""
	for i, name := range zoneActionNames {
		if a&(1<<i) != 0 {
			if s != "" {
				s += "+"
			}
			s += name
		}
	}
	return s
}

// zonePhase is a zone's state and whether a configuration still holds it
// (a zone draining on exit closes once it is released, not before: requests
// still being shut down may use the store).
type zonePhase struct {
	state    zoneState
	released bool
}

// step is the transition ev makes from p, for a zone whose store is
// shared or not. ok is false for an event that cannot happen in p (a bug
// to log): p is returned unchanged, with no action.
func step(p zonePhase, ev zoneEvent, shared bool) (next zonePhase, act zoneAction, ok bool) {
	s := p.state
	live := s == zoneConnecting || s == zoneServing
	draining := s == zoneDrainingReload || s == zoneDrainingExit || s == zoneDrainingRelease
	closed := zonePhase{state: zoneClosed, released: true}
	switch ev {
	case zoneOpen:
		if s == zoneUnopened {
			return zonePhase{state: zoneConnecting}, actConnect, true
		}
		return p, 0, true // every start of a configuration holding the zone says it again
	case zoneConnected:
		switch {
		case s == zoneConnecting:
			return zonePhase{state: zoneServing}, actKeepStore, true
		case draining, s == zoneStopped: // it connected as the process stopped: closed on release
			return p, actKeepStore, true
		case s == zoneClosed:
			return p, actDiscardStore, true
		}
	case zoneExit:
		switch {
		case s == zoneUnopened:
			return zonePhase{state: zoneStopped}, actStop, true
		case live && shared:
			return zonePhase{state: zoneDrainingExit}, actDrain | actBound, true
		case live:
			return zonePhase{state: zoneStopped}, actStop, true
		case s == zoneDrainingReload:
			return zonePhase{state: zoneDrainingExit, released: true}, actBound, true
		default: // exiting already, bounded already (draining_release), or over
			return p, 0, true
		}
	case zoneReleased:
		switch {
		case live: // running calls end, within drain_timeout, whatever the store
			return zonePhase{state: zoneDrainingRelease, released: true}, actDrain | actBound, true
		case s == zoneUnopened, s == zoneStopped:
			return closed, actStop | actClose, true
		}
	case zoneReplaced:
		switch {
		case live && shared:
			return zonePhase{state: zoneDrainingReload, released: true}, actDrain, true
		case s == zoneUnopened, live:
			return closed, actStop | actClose, true
		}
	case zoneReleasedOnExit:
		switch {
		case live && shared: // the process stops without having said so first
			return zonePhase{state: zoneDrainingExit, released: true}, actDrain | actBound, true
		case s == zoneUnopened, live, s == zoneStopped:
			return closed, actStop | actClose, true
		case s == zoneDrainingExit && !p.released:
			return zonePhase{state: zoneDrainingExit, released: true}, 0, true
		}
	case zoneDrained:
		switch {
		case draining && p.released:
			return closed, actStop | actClose, true
		case draining:
			return zonePhase{state: zoneStopped}, actStop, true
		}
	}
	return p, 0, false
}
