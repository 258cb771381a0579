package buffer_test

import (
	"flag"
	"os"
	"runtime"
	"strconv"
	"testing"
)

func TestMain(m *testing.M) {
	waitersInParallel(8)
	os.Exit(m.Run())
}

// waitersInParallel lets n parallel tests run at once unless -parallel
// says otherwise. go test's default is GOMAXPROCS (2 on a 2-core machine),
// but the contract suite's parallel tests mostly wait (stall timeouts,
// windows, idle expiry), each on its own store: more of them than cores
// can wait at once.
func waitersInParallel(n int) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set && runtime.GOMAXPROCS(0) < n {
		flag.Set("test.parallel", strconv.Itoa(n))
	}
}
