package natsstore

import (
	"errors"
	"fmt"
)

// Available reports whether the store can take writes now: the caller (the
// Caddy glue) refuses new sessions and streams with 503 while it cannot,
// before their requests reach the upstream.
func (st *Store) Available() error {
	if st.closing.Load() {
		return errors.New("natsstore: the store is closed")
	}
	if !st.nc.IsConnected() {
		return fmt.Errorf("natsstore: not connected to NATS (%s)", st.nc.Status())
	}
	return nil
}
