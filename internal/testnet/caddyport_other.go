//go:build !linux

package testnet

// CaddyPort returns a port for a Caddy listener: elsewhere than Linux, one
// that was free a moment ago.
func CaddyPort() (int, error) { return FreePort() }
