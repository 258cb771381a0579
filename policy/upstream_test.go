package policy

import "testing"

// Classify keeps the readings the proxy had before it was one function:
// what a reconnect must not retry, and what a credential check says.
func TestClassify(t *testing.T) {
	for status, want := range map[int]struct {
		refused bool
		verdict Verdict
	}{
		0: {false, Unverified}, 200: {false, Accepted}, 202: {false, Accepted}, 204: {false, Accepted},
		301: {false, Unverified}, 400: {true, Unverified}, 401: {true, Refused}, 403: {true, Refused},
		404: {true, SessionLost}, 405: {true, Unverified}, 409: {false, Unverified}, 429: {false, Unverified},
		500: {false, Unverified}, 502: {false, Unverified}, 503: {false, Unverified},
	} {
		u := Classify(status)
		if u.Refused() != want.refused || u.Verdict() != want.verdict {
			t.Errorf("%d: refused %v verdict %v, want %v %v", status, u.Refused(), u.Verdict(), want.refused, want.verdict)
		}
	}
}
