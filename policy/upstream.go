package policy

import "net/http"

// Upstream is what an upstream's status says to the proxy: the one reading
// of upstream statuses, for the follower (Refused: do not ask again), the
// credential check (the Verdict), and the end of a session (404).
type Upstream uint8

const (
	UpstreamNone        Upstream = iota // no status (the upstream was unreachable)
	UpstreamAccepted                    // 2xx
	UpstreamSessionGone                 // 404: the upstream does not know the session
	UpstreamDenied                      // 401, 403: the credential is refused
	UpstreamRefused                     // any other 4xx but 409 and 429: asking again will not help
	UpstreamRetry                       // 409 (it still holds another stream), 429, 5xx: may pass with time
	UpstreamOther                       // 1xx, 3xx
)

// Classify reads an upstream status.
func Classify(status int) Upstream {
	switch {
	case status == 0:
		return UpstreamNone
	case status/100 == 2:
		return UpstreamAccepted
	case status == http.StatusNotFound:
		return UpstreamSessionGone
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return UpstreamDenied
	case status == http.StatusConflict || status == http.StatusTooManyRequests || status >= 500:
		return UpstreamRetry
	case status >= 400:
		return UpstreamRefused
	}
	return UpstreamOther
}

// Refused reports a status that a reconnect must not retry: the upstream
// does not know the stream or will not serve it. 409 (the upstream still
// holds the old connection) and 429 pass with time; 5xx may too.
func (u Upstream) Refused() bool {
	return u == UpstreamSessionGone || u == UpstreamDenied || u == UpstreamRefused
}

// Verdict is what the status says of a credential check.
func (u Upstream) Verdict() Verdict {
	switch u {
	case UpstreamAccepted:
		return Accepted
	case UpstreamDenied:
		return Refused
	case UpstreamSessionGone:
		return SessionLost
	}
	return Unverified
}
