package resume

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
)

// takeoverStream gives a memory stream the shared stores' Takeover
// capability, so the engine's takeover path runs without NATS.
type takeoverStream struct{ buffer.Stream }

func (s takeoverStream) TakeOver(ctx context.Context) (buffer.Producer, buffer.Succession, error) {
	p, err := s.TakeProducer(ctx)
	return p, buffer.Succession{Previous: "a", Current: "b"}, err
}

type panickingNext struct{}

func (panickingNext) ServeHTTP(http.ResponseWriter, *http.Request) error { panic("sdk bug") }

// attack21: tap.go's attempt re-panics a next handler's panic "so it goes
// on to net/http's recovery". A takeover's (and takeBack's) upstream GET
// runs in a goroutine of its own (follow.go takeOver's go func), where no
// net/http recovery is: an in-process upstream handler that panics on the
// takeover's GET takes the whole process (every session) down, where the
// same panic on a client's request fails that one stream.
func TestAPanicOnATakeoverGETDoesNotCrashTheProcess(t *testing.T) {
	if os.Getenv("ATTACK21_CHILD") == "1" {
		h := testHandler(t)
		sess := newSession(t, h, "2025-11-25")
		str, err := sess.NewStream([]string{`1`}, [32]byte{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := str.Append(context.Background(), buffer.Entry{Fields: []byte("data: {}\n"), Upstream: "up-1"}); err != nil {
			t.Fatal(err)
		}
		if !h.takeOver(post("1"), panickingNext{}, sess, takeoverStream{str}) {
			t.Fatal("not taken over")
		}
		time.Sleep(time.Second)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestAPanicOnATakeoverGETDoesNotCrashTheProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "ATTACK21_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		s := string(out)
		if i := strings.Index(s, "panic:"); i >= 0 {
			s = s[i:min(len(s), i+600)]
		}
		t.Fatalf("the process died (%v):\n%s", err, s)
	}
}
