//go:build !linux

package testnet

// CaddyPort returns a port for a Caddy listener: elsewhere than Linux, one
// that was free a moment ago.
func CaddyPort() (int, error) { return FreePort() }

// Listening is unknown elsewhere than Linux: -1.
func Listening(port int) (int, error) { return -1, nil }
