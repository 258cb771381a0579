package natsstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Available implements buffer.Availability: whether the store can take
// writes now. The caller (the resume engine) refuses new sessions and
// streams with 503 while it cannot, before their requests reach the
// upstream. A live connection is not
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
	probeEvery    = time.Second     // how often the probe writes
	probeTimeout  = 2 * time.Second // how long its acks may take before the store counts as unavailable
	probeKey      = "_probe"        // the probe's key and subject token, which mirrors skip
	probeFailures = 2               // probes failed in a row that make the store unavailable
)

// healthLoop writes, every second, what a call needs to be able to write:
// a probe key to every bucket, and a message to the events stream (purged
// at once). JetStream acknowledges a write only once
// a quorum of that stream's replicas stored it, and it places each stream
// and bucket on peers of its own, so each is probed (a stream's info, by
// contrast, is answered by a leader that has not yet noticed it lost its
// quorum).
func (st *Store) healthLoop() {
	defer st.wg.Done()
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	failed := 0
	for {
		select {
		case <-st.ctx.Done():
			return
		case <-t.C:
		}
		if st.closing.Load() {
			return
		}
		if !st.nc.IsConnected() {
			continue // Available says so already; the probe would only time out
		}
		err := st.probe()
		if st.ctx.Err() == nil && !st.closing.Load() {
			if st.checkData(err != nil) && err != nil {
				err = st.probe() // what failed was recreated: probe it again
			}
		}
		switch {
		case st.ctx.Err() != nil:
			return
		case err == nil:
			failed = 0
			st.probeErr.Store(nil)
		default:
			// One slow ack is load, not a lost quorum.
			if failed++; failed < probeFailures {
				continue
			}
			err = fmt.Errorf("natsstore: JetStream does not store writes (no quorum?): %w", err)
			if st.probeErr.Swap(&err) == nil {
				st.fault("probe", err)
			}
		}
	}
}

// probe writes to every stream of the zone at once, and returns the first
// refusal. Every replica writes the same key and subject, so a replica
// that dies leaves nothing behind: the next probe overwrites (buckets) or
// purges (events) what it wrote.
func (st *Store) probe() error {
	ctx, cancel := context.WithTimeout(st.ctx, probeTimeout)
	defer cancel()
	n := st.names
	errs := make(chan error, 6)
	put := func(bucket string) {
		_, err := st.js.Publish(ctx, "$KV."+bucket+"."+probeKey, nil)
		if err != nil {
			err = fmt.Errorf("bucket %s: %w", bucket, err)
		}
		errs <- err
	}
	for _, b := range []string{n.meta, n.sessions, n.streams, n.tombs, n.leases} {
		go put(b)
	}
	go func() {
		subject := n.evPrefix + probeKey
		_, err := st.js.Publish(ctx, subject, nil)
		if err == nil {
			err = st.events.Purge(ctx, jetstream.WithPurgeSubject(subject))
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
