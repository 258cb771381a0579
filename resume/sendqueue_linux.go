package resume

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// sendQueueEmpty reports whether nothing written to c waits in the kernel,
// and its send buffer is at least minSendBuffer.
func sendQueueEmpty(c syscall.Conn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	ok := false
	err = rc.Control(func(fd uintptr) {
		queued, err := unix.IoctlGetInt(int(fd), unix.SIOCOUTQ)
		if err != nil || queued != 0 {
			return
		}
		size, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
		ok = err == nil && size >= minSendBuffer
	})
	return err == nil && ok
}
