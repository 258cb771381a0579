package mcptest

import (
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// StartNATS runs a JetStream server in this process, on a loopback port
// (0: any free one), storing in dir. Stop it with ShutdownNATS.
func StartNATS(dir string, port int) (*server.Server, error) {
	if port == 0 {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		port = p
	}
	return startNATS(&server.Options{ServerName: "mcptest", Host: "127.0.0.1", Port: port, JetStream: true,
		StoreDir: dir, NoLog: true, NoSigs: true, MaxPayload: 64 << 20, MaxPending: 64 << 20})
}

// StartNATSCluster runs len(dirs) JetStream servers in this process, routed
// to each other on loopback, each storing in its dir, and waits for a
// JetStream meta leader.
func StartNATSCluster(dirs ...string) ([]*server.Server, error) {
	var routes []*url.URL
	opts := make([]*server.Options, len(dirs))
	for i, dir := range dirs {
		rp, err := FreePort()
		if err != nil {
			return nil, err
		}
		cp, err := FreePort()
		if err != nil {
			return nil, err
		}
		u, _ := url.Parse(fmt.Sprintf("nats-route://127.0.0.1:%d", rp))
		routes = append(routes, u)
		opts[i] = &server.Options{ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: cp,
			JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true, MaxPayload: 64 << 20, MaxPending: 64 << 20,
			Cluster: server.ClusterOpts{Name: "mcptest", Host: "127.0.0.1", Port: rp}}
	}
	servers := make([]*server.Server, len(dirs))
	errs := make([]error, len(dirs))
	var wg sync.WaitGroup
	for i, o := range opts {
		o.Routes = routes
		wg.Add(1)
		go func() { // each waits for its routes: start them together
			defer wg.Done()
			servers[i], errs[i] = startNATS(o)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			ShutdownNATS(servers...)
			return nil, err
		}
	}
	leader := Eventually(30*time.Second, 20*time.Millisecond, func() bool {
		for _, s := range servers {
			if s.JetStreamIsLeader() {
				return true
			}
		}
		return false
	})
	if !leader {
		ShutdownNATS(servers...)
		return nil, fmt.Errorf("no JetStream meta leader in 30s")
	}
	return servers, nil
}

func startNATS(o *server.Options) (*server.Server, error) {
	s, err := server.NewServer(o)
	if err != nil {
		return nil, err
	}
	s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("NATS server %s not ready in 30s", o.ServerName)
	}
	return s, nil
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
