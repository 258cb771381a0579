// Package cachedemo is a suite under harness.MainBothStores whose one test
// reads a fixture in its memory leg only: attack21's
// TestAFixtureChangeRerunsTheSuite changes the fixture and asks go test again.
package cachedemo

import (
	"os"
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

func TestMain(m *testing.M) { harness.MainBothStores(m, harness.Shards{N: 2}) }

func TestReadsTheFixture(t *testing.T) {
	if mcptest.StoreBlock != "" {
		return // the JetStream leg
	}
	b, err := os.ReadFile("testdata/fixture.txt")
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != "ok\n" {
		t.Fatalf("fixture %q", b)
	}
}

func TestOther(t *testing.T) {}
