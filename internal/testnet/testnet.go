// Package testnet runs what tests need on loopback that needs nothing of
// the proxy: free ports and NATS servers with JetStream, in this process.
// It stands apart from mcptest, which imports the proxy (natsstore
// included), so that natsstore's own tests can use it too.
package testnet

import (
	"fmt"
	"net"
	"net/url"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// StartNATS runs a JetStream server in this process, on a loopback port
// (0: any free one), storing in dir. Stop it with ShutdownNATS.
func StartNATS(dir string, port int) (*server.Server, error) {
	return startOn(port, &server.Options{ServerName: "testnet", Host: "127.0.0.1", JetStream: true,
		StoreDir: dir, NoLog: true, NoSigs: true, MaxPayload: 64 << 20, MaxPending: 64 << 20})
}

// StartStockNATS runs a JetStream server in this process as nats-server
// runs with no options but its port and store directory: max_payload 1 MiB,
// NATS's default (StartNATS raises it). Stop it with ShutdownNATS.
func StartStockNATS(dir string, port int) (*server.Server, error) {
	return startOn(port, &server.Options{ServerName: "testnet", Host: "127.0.0.1", JetStream: true,
		StoreDir: dir, NoLog: true, NoSigs: true})
}

// startOn starts a server with o on port (0: any free one, which the
// server picks as it binds: a port found free beforehand may be taken by
// another test's socket before the server binds it).
func startOn(port int, o *server.Options) (*server.Server, error) {
	o.Port = port
	if port == 0 {
		o.Port = server.RANDOM_PORT
	}
	return startNATS(o, 30*time.Second)
}

// StockNATS runs StartStockNATS's server for t until t ends.
func StockNATS(t TB) *server.Server {
	t.Helper()
	s, err := StartStockNATS(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ShutdownNATS(s) })
	return s
}

// StartNATSCluster runs len(dirs) JetStream servers in this process, routed
// to each other on loopback, each storing in its dir, and waits until their
// JetStream meta group has a leader, knows every server, and every server
// is current (a cluster that has only just elected a leader may still
// refuse to place a replicated stream).
func StartNATSCluster(dirs ...string) ([]*server.Server, error) {
	// Every server must know the others' route ports before it starts, so
	// they are found free beforehand; one taken meanwhile by another test's
	// socket leaves its server unable to listen (NATS logs it and waits).
	// A healthy server listens within moments: after a few seconds, start
	// the cluster again on other ports.
	return startNATSClusterRetrying(dirs, FreePort, 10*time.Second)
}

func startNATSClusterRetrying(dirs []string, routePort func() (int, error), ready time.Duration) ([]*server.Server, error) {
	var err error
	for range 3 {
		var servers []*server.Server
		if servers, err = startNATSCluster(dirs, routePort, ready); err == nil {
			return servers, nil
		}
	}
	return nil, err
}

func startNATSCluster(dirs []string, routePort func() (int, error), ready time.Duration) ([]*server.Server, error) {
	var routes []*url.URL
	opts := make([]*server.Options, len(dirs))
	for i, dir := range dirs {
		rp, err := routePort()
		if err != nil {
			return nil, err
		}
		u, _ := url.Parse(fmt.Sprintf("nats-route://127.0.0.1:%d", rp))
		routes = append(routes, u)
		opts[i] = &server.Options{ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: server.RANDOM_PORT,
			JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true, MaxPayload: 64 << 20, MaxPending: 64 << 20,
			Cluster: server.ClusterOpts{Name: "testnet", Host: "127.0.0.1", Port: rp}}
	}
	servers := make([]*server.Server, len(dirs))
	errs := make([]error, len(dirs))
	var wg sync.WaitGroup
	for i, o := range opts {
		o.Routes = routes
		wg.Add(1)
		go func() { // each waits for its routes: start them together
			defer wg.Done()
			servers[i], errs[i] = startNATS(o, ready)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			ShutdownNATS(servers...)
			return nil, err
		}
	}
	for deadline := time.Now().Add(60 * time.Second); !settled(servers); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			ShutdownNATS(servers...)
			return nil, fmt.Errorf("no settled JetStream meta group of %d in 60s", len(servers))
		}
	}
	return servers, nil
}

// settled reports whether servers' JetStream meta group has a leader that
// knows them all, and every one of them is current.
func settled(servers []*server.Server) bool {
	for _, s := range servers {
		if s.JetStreamIsLeader() && len(s.JetStreamClusterPeers()) == len(servers) {
			for _, o := range servers {
				if !o.JetStreamIsCurrent() {
					return false
				}
			}
			return true
		}
	}
	return false
}

func startNATS(o *server.Options, ready time.Duration) (*server.Server, error) {
	s, err := server.NewServer(o)
	if err != nil {
		return nil, err
	}
	s.Start()
	if !s.ReadyForConnections(ready) {
		s.Shutdown()
		return nil, fmt.Errorf("NATS server %s not ready in %s", o.ServerName, ready)
	}
	return s, nil
}

// TB is what NATS and NATSCluster need of a test; testing.TB has it.
type TB interface {
	Helper()
	Fatal(args ...any)
	Cleanup(func())
	TempDir() string
}

// NATS runs a JetStream server for t, on any free loopback port, until t
// ends.
func NATS(t TB) *server.Server {
	t.Helper()
	s, err := StartNATS(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ShutdownNATS(s) })
	return s
}

// NATSCluster runs a settled cluster of n JetStream servers for t until t
// ends.
func NATSCluster(t TB, n int) []*server.Server {
	t.Helper()
	dirs := make([]string, n)
	for i := range dirs {
		dirs[i] = t.TempDir()
	}
	servers, err := StartNATSCluster(dirs...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ShutdownNATS(servers...) })
	return servers
}

// ShutdownNATS stops servers (nil ones are skipped) and waits for them.
func ShutdownNATS(servers ...*server.Server) {
	for _, s := range servers {
		if s != nil {
			s.Shutdown()
			s.WaitForShutdown()
		}
	}
}
