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
	probeTimeout = 2 * time.Second  // how long its ack may take before the store counts as unavailable
	probeTTL     = 30 * time.Second // how long a probe key outlives its replica
)

// healthLoop writes a key of this replica's to the zone's META bucket
// every second. JetStream acknowledges a write only once a quorum of the
// bucket's replicas stored it, as it does the events (a stream's info, by
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
		if !st.nc.IsConnected() {
			continue // Available says so already; the probe would only time out
		}
		ctx, cancel := context.WithTimeout(st.ctx, probeTimeout)
		_, err := st.js.Publish(ctx, "$KV."+st.names.meta+".probe."+st.probeKey, nil, jetstream.WithMsgTTL(probeTTL))
		cancel()
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
