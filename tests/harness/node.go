package harness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// installedMark is written into node_modules once npm ci has finished there:
// npm ci removes node_modules first, so a package's own files can be present
// while another process is still installing.
const installedMark = ".mcpr-installed"

// TypeScriptSDK makes sure the pinned TypeScript SDK is installed in dir
// (tests/ts, from its package-lock.json). Test packages run as separate
// processes side by side and more than one uses dir, so the check and the
// install hold an exclusive lock on a file beside node_modules: nobody reads
// the tree while another process's npm ci is rewriting it. skip is set when
// node or npm is not on PATH.
func TypeScriptSDK(dir string) (skip string, err error) {
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " not found on PATH", nil
		}
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".npm-install.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("locking %s: %v", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	mark := filepath.Join(dir, "node_modules", installedMark)
	if _, err := os.Stat(mark); err == nil {
		return "", nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("npm ci in %s: %v\n%s", dir, err, out.String())
	}
	return "", os.WriteFile(mark, nil, 0o644)
}
