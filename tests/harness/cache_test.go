package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// attack21: go test caches a package's result keyed by the files and
// environment its test process read, which the testing package logs to
// -test.testlogfile. mainLegs' children get the parent's arguments
// (runArgs copies os.Args[1:]), that flag with them, and each truncates
// the one log: what the parent's tests read is lost, and a change to it
// leaves go test answering "ok (cached)" without running the suite.
// cachedemo's memory leg reads testdata/fixture.txt; broken, it fails
// under -count=1, yet a plain go test reports the cached pass. (The same
// package under harness.Main reruns and fails.)
func TestAFixtureChangeRerunsTheSuite(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: this test runs go test on a child package, which takes minutes")
	}
	fixture := filepath.Join("internal", "cachedemo", "testdata", "fixture.txt")
	orig, err := os.ReadFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile(fixture, orig, 0o644) })
	goTest := func() string {
		out, _ := exec.Command("go", "test", "./internal/cachedemo").CombinedOutput()
		return string(out)
	}
	if err := os.WriteFile(fixture, []byte("ok\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := goTest(); !strings.Contains(out, "ok") {
		t.Fatalf("the suite with its fixture intact: %s", out)
	}
	if err := os.WriteFile(fixture, []byte("broken\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := goTest(); strings.Contains(out, "(cached)") || !strings.Contains(out, "FAIL") {
		t.Fatalf("after the fixture its test reads changed, go test answered:\n%s", out)
	}
}
