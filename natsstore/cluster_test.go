package natsstore

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// A 3-node cluster (R3) loses the events stream's leader (a graceful
// shutdown) while a stream is being appended and read: every appended
// event is read back once and in order.
func TestClusterLosesLeader(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: this test starts a 3-node JetStream cluster (about 10 s); the full run covers it")
	}
	servers := testnet.NATSCluster(t, 3)
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
			got, err := str.Append(context.Background(), buffer.Entry{Fields: []byte(fmt.Sprintf("data: event %d\n", seq))})
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
