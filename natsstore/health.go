package natsstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Available reports whether the store can take writes now: the caller (the
// Caddy glue) refuses new sessions and streams with 503 while it cannot,
// before their requests reach the upstream. A live connection is not
// enough: a cluster that lost its quorum keeps the connection up and
// stores nothing, so the last probe write must have been stored too.
func (st *Store) Available() error {
	if st.closing.Load() {
		return errors.New("natsstore: the store is closed")
	}
	if !st.nc.IsConnected() {
		return fmt.Errorf("natsstore: not connected to NATS (%s)", st.nc.Status())
	}
	if err := st.probeErr.Load(); err != nil {
		return *err
	}
	return nil
}

const (
	probeEvery   = time.Second      // how often the probe writes
	probeTimeout = 2 * time.Second  // how long its acks may take before the store counts as unavailable
	probeTTL     = 30 * time.Second // how long a META probe key outlives its replica
	probePrefix  = "_probe."        // the probe's keys, which mirrors skip
)

// healthLoop writes, every second, what a call needs to be able to write:
// a probe key of this replica's to every bucket, and a message to the
// events stream (deleted at once). JetStream acknowledges a write only once
// a quorum of that stream's replicas stored it, and it places each stream
// and bucket on peers of its own, so each is probed (a stream's info, by
// contrast, is answered by a leader that has not yet noticed it lost its
// quorum).
func (st *Store) healthLoop() {
	defer st.wg.Done()
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		select {
		case <-st.ctx.Done():
			return
		case <-t.C:
		}
		if st.closing.Load() {
			return // its keys are being dropped
		}
		if !st.nc.IsConnected() {
			continue // Available says so already; the probe would only time out
		}
		err := st.probe()
		switch {
		case st.ctx.Err() != nil:
			return
		case err != nil:
			err = fmt.Errorf("natsstore: JetStream does not store writes (no quorum?): %w", err)
			if st.probeErr.Swap(&err) == nil {
				st.fault("probe", err)
			}
		default:
			st.probeErr.Store(nil)
		}
	}
}

// probe writes to every stream of the zone at once, and returns the first
// refusal.
func (st *Store) probe() error {
	ctx, cancel := context.WithTimeout(st.ctx, probeTimeout)
	defer cancel()
	n := st.names
	key := probePrefix + st.probeKey
	errs := make(chan error, 6)
	put := func(bucket string, opts ...jetstream.PublishOpt) {
		_, err := st.js.Publish(ctx, "$KV."+bucket+"."+key, nil, opts...)
		if err != nil {
			err = fmt.Errorf("bucket %s: %w", bucket, err)
		}
		errs <- err
	}
	go put(n.meta, jetstream.WithMsgTTL(probeTTL))
	go put(n.sessions)
	go put(n.streams)
	go put(n.tombs)
	go put(n.leases, jetstream.WithMsgTTL(probeTTL))
	go func() {
		ack, err := st.js.Publish(ctx, n.evPrefix+key, nil)
		if err == nil {
			err = st.events.DeleteMsg(ctx, ack.Sequence)
		}
		if err != nil {
			err = fmt.Errorf("stream %s: %w", n.events, err)
		}
		errs <- err
	}()
	var first error
	for range 6 {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// dropProbeKeys deletes this replica's probe keys from the buckets whose
// keys do not expire by themselves.
func (st *Store) dropProbeKeys(ctx context.Context) {
	for _, b := range []string{st.names.sessions, st.names.streams, st.names.tombs} {
		str, err := st.js.Stream(ctx, "KV_"+b)
		if err == nil {
			err = str.Purge(ctx, jetstream.WithPurgeSubject("$KV."+b+"."+probePrefix+st.probeKey))
		}
		if err != nil {
			st.fault("probe", err)
		}
	}
}
