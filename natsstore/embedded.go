package natsstore

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// StartEmbedded starts a single-node JetStream server in this process,
// storing in dir, as Options.Embedded does. It listens on no port: stores
// connect to it in-process, and nothing else can (it has no users to
// authenticate, and holds every session's events and the zone's secret).
// Several stores (zones) may share it through Options.Server; the caller
// shuts it down.
func StartEmbedded(dir string, logs bool) (*server.Server, error) {
	srv, err := server.NewServer(&server.Options{
		ServerName: "mcp-resume-embedded",
		JetStream:  true,
		StoreDir:   dir,
		DontListen: true,
		MaxPayload: embeddedMaxPayload,
		MaxPending: embeddedMaxPayload,
		NoLog:      !logs,
		NoSigs:     true,
	})
	if err != nil {
		return nil, fmt.Errorf("natsstore: embedded server: %w", err)
	}
	if logs {
		srv.ConfigureLogger()
	}
	srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("natsstore: the embedded server did not start")
	}
	return srv, nil
}
