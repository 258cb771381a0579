package mcptest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// BuildCaddy builds cmd/caddy (Caddy with the module) into dir and returns
// the binary's path: tests that need several Caddy processes, or a process
// to kill, run it. With race, the binary has the race detector, as the
// tests do under -race: a race in a replica ends up in its logs.
func BuildCaddy(dir string, race bool) (string, error) {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %v", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	bin := filepath.Join(dir, "caddy")
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "./cmd/caddy")...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/caddy: %v\n%s", err, out)
	}
	return bin, nil
}

// Process is Caddy running as a child process.
type Process struct {
	Config Config
	bin    string
	home   string // HOME and XDG dirs: its data directory
	cmd    *exec.Cmd
	done   chan struct{}
	mu     sync.Mutex
	logs   bytes.Buffer
}

// StartProcess runs bin with cfg (written as a Caddyfile into home, which
// also holds Caddy's data directory) and waits until every site listens.
func StartProcess(bin, home string, cfg Config) (*Process, error) {
	p := &Process{Config: cfg, bin: bin, home: home}
	return p, p.Start()
}

// Start starts the process (again, after it stopped).
func (p *Process) Start() error {
	file := filepath.Join(p.home, "Caddyfile")
	if err := os.WriteFile(file, []byte(p.Config.Caddyfile()), 0o600); err != nil {
		return err
	}
	cmd := exec.Command(p.bin, "run", "--config", file, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "HOME="+p.home, "XDG_CONFIG_HOME="+p.home, "XDG_DATA_HOME="+p.home)
	cmd.Stdout, cmd.Stderr = (*lockedWriter)(p), (*lockedWriter)(p)
	if err := cmd.Start(); err != nil {
		return err
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go func() { cmd.Wait(); close(p.done) }()
	for _, s := range p.Config.Sites {
		if err := waitListening(s.Port, 30*time.Second); err != nil {
			p.Kill()
			return fmt.Errorf("%v\n%s", err, p.Logs())
		}
	}
	return nil
}

type lockedWriter Process

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.logs.Write(b)
}

// Logs returns what the process wrote so far.
func (p *Process) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// Terminate sends SIGTERM (Caddy stops gracefully) and waits up to timeout
// for the process to exit; it reports whether it did.
func (p *Process) Terminate(timeout time.Duration) bool {
	p.cmd.Process.Signal(syscall.SIGTERM)
	return p.Wait(timeout)
}

// Kill sends SIGKILL: the process dies without a chance to clean up.
func (p *Process) Kill() {
	p.cmd.Process.Kill()
	<-p.done
}

// Wait waits up to timeout for the process to exit.
func (p *Process) Wait(timeout time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// Pid is the running process's ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}
