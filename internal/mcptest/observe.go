package mcptest

// Watching resources (kernel socket queues, the Go heap) and waiting.

import (
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// TCPSocket is one IPv4/IPv6 TCP socket of this network namespace as
// /proc/net/tcp{,6} shows it.
type TCPSocket struct {
	LocalPort, RemotePort int
	State                 int    // 1 = ESTABLISHED
	TxQueue               int64  // bytes written by the application, not yet acknowledged by the peer
	RxQueue               int64  // bytes received, not yet read by the application
	Inode                 uint64 // the socket's inode: /proc/<pid>/fd links to "socket:[inode]"
}

// TCPSockets lists the TCP sockets of the network namespace.
func TCPSockets() ([]TCPSocket, error) {
	var out []TCPSocket
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			if os.IsNotExist(err) {
				continue
			}
			return nil, err
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 10 {
				continue
			}
			lp, err1 := hexPort(fs[1])
			rp, err2 := hexPort(fs[2])
			st, err3 := strconv.ParseInt(fs[3], 16, 32)
			q := strings.SplitN(fs[4], ":", 2)
			if err1 != nil || err2 != nil || err3 != nil || len(q) != 2 {
				continue
			}
			tx, err4 := strconv.ParseInt(q[0], 16, 64)
			rx, err5 := strconv.ParseInt(q[1], 16, 64)
			ino, err6 := strconv.ParseUint(fs[9], 10, 64)
			if err4 != nil || err5 != nil || err6 != nil {
				continue
			}
			out = append(out, TCPSocket{LocalPort: lp, RemotePort: rp, State: int(st), TxQueue: tx, RxQueue: rx, Inode: ino})
		}
	}
	return out, nil
}

// ListeningPorts returns the TCP ports process pid listens on: the
// listening sockets of the network namespace whose inodes are among the
// process's open files. Other processes' listeners (other test binaries'
// servers, run by go test beside this one) are not among them.
func ListeningPorts(pid int) (map[int]bool, error) {
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(fdDir)
	if err != nil {
		return nil, err
	}
	own := map[uint64]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(fdDir + "/" + fd.Name())
		if err != nil {
			continue // closed meanwhile
		}
		if s, ok := strings.CutPrefix(link, "socket:["); ok {
			if ino, err := strconv.ParseUint(strings.TrimSuffix(s, "]"), 10, 64); err == nil {
				own[ino] = true
			}
		}
	}
	socks, err := TCPSockets()
	if err != nil {
		return nil, err
	}
	out := map[int]bool{}
	for _, s := range socks {
		if s.State == 0x0A && own[s.Inode] { // LISTEN
			out[s.LocalPort] = true
		}
	}
	return out, nil
}

func hexPort(addr string) (int, error) {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return 0, fmt.Errorf("no port in %q", addr)
	}
	p, err := strconv.ParseInt(addr[i+1:], 16, 32)
	return int(p), err
}

// QueuedBytes sums the send and receive queues of every established socket
// on either end of a connection to or from port: the bytes the kernel holds
// in flight on those connections.
func QueuedBytes(port int) (tx, rx int64, err error) {
	socks, err := TCPSockets()
	if err != nil {
		return 0, 0, err
	}
	for _, s := range socks {
		if s.State == 1 && (s.LocalPort == port || s.RemotePort == port) {
			tx += s.TxQueue
			rx += s.RxQueue
		}
	}
	return tx, rx, nil
}

// LiveHeap returns the bytes of live heap objects after a full GC: what the
// process really holds, without garbage not yet collected.
func LiveHeap() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// SettledHeap returns LiveHeap once it has settled (two readings 200ms apart
// within 256 KiB of each other, or after 5s): what earlier tests left behind
// (goroutines and connections winding down) is gone by then, so it makes a
// baseline for growth.
func SettledHeap() uint64 {
	prev := LiveHeap()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		cur := LiveHeap()
		if cur <= prev+256<<10 && prev <= cur+256<<10 {
			return cur
		}
		prev = cur
	}
	return prev
}

// Eventually polls cond every interval until it holds or timeout passes.
func Eventually(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
}

// Parallel runs f(i) for i in [0,n) on up to workers goroutines and returns
// the first error; after one, it starts no more.
func Parallel(n, workers int, f func(i int) error) error {
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for w := 0; w < min(workers, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { first = err })
					next.Store(int64(n))
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}
