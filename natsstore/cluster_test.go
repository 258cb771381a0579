package natsstore

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startCluster runs three JetStream servers in this process, routed to
// each other on loopback.
func startCluster(t *testing.T) []*server.Server {
	t.Helper()
	const n = 3
	var routes []*url.URL
	opts := make([]*server.Options, n)
	for i := range opts {
		rp := freePort(t)
		u, _ := url.Parse(fmt.Sprintf("nats-route://127.0.0.1:%d", rp))
		routes = append(routes, u)
		opts[i] = &server.Options{ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: freePort(t),
			JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
			Cluster: server.ClusterOpts{Name: "mcpr", Host: "127.0.0.1", Port: rp}}
	}
	servers := make([]*server.Server, n)
	var wg sync.WaitGroup
	for i, o := range opts {
		o.Routes = routes
		wg.Add(1)
		go func() { // each waits for its routes: start them together
			defer wg.Done()
			s, err := server.NewServer(o)
			if err != nil {
				t.Error(err)
				return
			}
			s.Start()
			if !s.ReadyForConnections(30 * time.Second) {
				t.Errorf("%s not ready", o.ServerName)
			}
			servers[i] = s
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, s := range servers {
			if s != nil {
				s.Shutdown()
				s.WaitForShutdown()
			}
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	waitUntil(t, "a JetStream meta group of three, all current", 60*time.Second, func() bool {
		for _, s := range servers {
			if s.JetStreamIsLeader() && len(s.JetStreamClusterPeers()) == n {
				for _, o := range servers {
					if !o.JetStreamIsCurrent() {
						return false
					}
				}
				return true
			}
		}
		return false
	})
	return servers
}

// A 3-node cluster (R3) loses the events stream's leader (a graceful
// shutdown) while a stream is being appended and read: every appended
// event is read back once and in order.
func TestClusterLosesLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	servers := startCluster(t)
	var urls []string
	for _, s := range servers {
		urls = append(urls, s.ClientURL())
	}
	st := openAt(t, urls, func(o *Options) { o.Replicas = 3 })
	s, err := st.CreateSession("sess", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str, _ := s.NewStream([]string{"1"}, [32]byte{1})
	r, _ := str.Attach(1)
	defer r.Close()

	const total = 3000
	appended := make(chan error, 1)
	killAt := make(chan struct{})
	go func() {
		for seq := uint64(1); seq <= total; seq++ {
			got, err := str.Append(context.Background(), []byte(fmt.Sprintf("data: event %d\n", seq)), nil)
			if err != nil || got != seq {
				appended <- fmt.Errorf("append %d: %d %v", seq, got, err)
				return
			}
			if seq == total/3 {
				close(killAt)
			}
			if seq%50 == 0 {
				time.Sleep(2 * time.Millisecond) // a stream, not a burst: the failover lands mid-stream
			}
		}
		str.Complete()
		appended <- nil
	}()
	go func() {
		<-killAt
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		info, err := st.events.Info(ctx)
		if err != nil || info.Cluster == nil {
			t.Errorf("stream info: %v", err)
			return
		}
		for _, srv := range servers {
			if srv.Name() == info.Cluster.Leader {
				t.Logf("shutting down the stream leader %s", srv.Name())
				srv.Shutdown()
				return
			}
		}
		t.Errorf("no leader named %q", info.Cluster.Leader)
	}()
	seqs, err := readSeqs(t, r, s.Epoch(), str.Num(), 1, total+1)
	if err != io.EOF {
		t.Fatalf("end of the stream: %v (after %d events)", err, len(seqs))
	}
	if err := <-appended; err != nil {
		t.Fatal(err)
	}
	checkRun(t, seqs, 1, total)
	if n := st.Counters().EventsEvictedBeforeAck.Load(); n != 0 {
		t.Fatalf("EventsEvictedBeforeAck = %d", n)
	}
}
