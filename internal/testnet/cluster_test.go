package testnet

import (
	"net"
	"strings"
	"testing"
	"time"
)

// A route port taken by another socket between being found free and being
// bound leaves its server unable to listen: the cluster is started again
// on other ports rather than failing the test that asked for it.
func TestClusterStartedAgainWhenARoutePortWasTaken(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	first := true
	port := func() (int, error) {
		if first {
			first = false
			return taken.Addr().(*net.TCPAddr).Port, nil
		}
		return FreePort()
	}
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}

	if _, err := startNATSCluster(dirs, port, time.Second); err == nil || !strings.Contains(err.Error(), "not ready") {
		t.Fatalf("one attempt on a taken route port: %v, want not ready", err)
	}
	first = true
	servers, err := startNATSClusterRetrying(dirs, port, time.Second)
	if err != nil {
		t.Fatalf("retrying: %v", err)
	}
	defer ShutdownNATS(servers...)
	for _, s := range servers {
		if s.ClusterAddr().Port == taken.Addr().(*net.TCPAddr).Port {
			t.Fatalf("%s routes on the taken port", s.Name())
		}
	}
}
