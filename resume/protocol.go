package resume

import (
	"mime"
	"net/http"
	"strings"
)

// What mcp_resume knows of MCP's Streamable HTTP transport: header names,
// which protocol versions have resumable streams, how requests and SSE
// responses are recognised. (The proxy's own answers are refusals.go's.)

// Header names (canonical form; matching is case-insensitive).
const (
	hdrSessionID   = "Mcp-Session-Id"
	hdrVersion     = "Mcp-Protocol-Version"
	hdrLastEventID = "Last-Event-Id"
)

// resumable reports whether a protocol version has resumable streams.
// 2026-07-28 removed them (a closed stream is a cancellation there), and
// versions this proxy does not know pass through untouched.
func resumable(version string) bool {
	switch version {
	case "2025-03-26", "2025-06-18", "2025-11-25":
		return true
	}
	return false
}

// defaultVersion is what the spec says to assume without a version header.
const defaultVersion = "2025-03-26"

// primes reports whether a session's streams start with a priming event:
// only from 2025-11-25 on, since older clients may choke on empty data.
func primes(version string) bool { return version >= "2025-11-25" }

func acceptsSSE(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		if strings.Contains(v, "text/event-stream") {
			return true
		}
	}
	return false
}

func isJSON(contentType string) bool {
	ct, _, _ := mime.ParseMediaType(contentType)
	return ct == "application/json"
}

// tappable reports whether an upstream response is an SSE stream the proxy
// can read: a 200 text/event-stream in plain bytes. (Tapped requests ask the
// upstream for identity encoding; one that compresses anyway passes through.)
func tappable(status int, h http.Header) bool {
	if status != http.StatusOK {
		return false
	}
	ct, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	if ct != "text/event-stream" {
		return false
	}
	enc := strings.TrimSpace(h.Get("Content-Encoding"))
	return enc == "" || strings.EqualFold(enc, "identity")
}

// sessionIDOf returns the request's Mcp-Session-Id, and false if it carries
// the header more than once: the proxy checks one value and the upstream
// might read another, so such requests are refused.
func sessionIDOf(r *http.Request) (string, bool) {
	vs := r.Header.Values(hdrSessionID)
	switch len(vs) {
	case 0:
		return "", true
	case 1:
		return vs[0], true
	}
	return "", false
}

// prepareSSEHeaders sets what every SSE response from the proxy carries. The
// body length is the proxy's business now, and intermediaries must not
// buffer or transform it.
func prepareSSEHeaders(h http.Header) {
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache, no-transform")
	h.Set("X-Accel-Buffering", "no")
	h.Del("Content-Length")
	h.Del("Content-Encoding")
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
