package policy

import "testing"

func TestAuthorize(t *testing.T) {
	owner := Access{Named: true, Remembered: true, IdentityMatch: true}
	bearer := owner
	bearer.Bearer = true
	with := func(a Access, f func(*Access)) Access { f(&a); return a }
	for _, c := range []struct {
		name string
		a    Access
		want AccessDecision
	}{
		{"no session header: nothing to check", Access{Remembered: true}, Allow},
		{"a session the proxy knows nothing of: the upstream judges", Access{Named: true}, Allow},
		{"its owner, identity only", owner, Allow},
		{"another identity", Access{Named: true, Remembered: true}, Deny},
		{"another identity, same token", with(bearer, func(a *Access) { a.IdentityMatch, a.CredentialMatch = false, true }), Deny},
		{"no credential on either side, or the bound one", with(bearer, func(a *Access) { a.CredentialMatch = true }), Allow},
		{"the bound token on a call", with(bearer, func(a *Access) { a.CredentialMatch = true }), Allow},
		{"the bound token on a DELETE", with(bearer, func(a *Access) { a.CredentialMatch, a.Kind = true, EndSession }), Allow},
		{"the bound token on a resume, expired or not", with(bearer, func(a *Access) { a.CredentialMatch, a.Kind = true, ReadsLog }), Allow},
		{"a rotated token on a call", bearer, Vouch},
		{"a rotated token on a resume", with(bearer, func(a *Access) { a.Kind = ReadsLog }), Vouch},
		{"a rotated token on a DELETE", with(bearer, func(a *Access) { a.Kind = EndSession }), Vouch},
		{"a rotated token, rebinding off", with(bearer, func(a *Access) { a.RebindOff = true }), Deny},
		{"the bound token, rebinding off", with(bearer, func(a *Access) { a.CredentialMatch, a.RebindOff = true, true }), Allow},
		{"the bound token the upstream refused a takeover", with(bearer, func(a *Access) { a.CredentialMatch, a.UpstreamRefused, a.Kind = true, true, ReadsLog }), Vouch},
		{"the bound token the upstream refused, rebinding off", with(bearer, func(a *Access) { a.CredentialMatch, a.UpstreamRefused, a.RebindOff = true, true, true }), Vouch},
		{"a token the upstream refused, identity binding", with(owner, func(a *Access) { a.UpstreamRefused, a.Kind = true, ReadsLog }), Vouch},
		{"a token the upstream refused, another identity", with(owner, func(a *Access) { a.UpstreamRefused, a.IdentityMatch = true, false }), Deny},
		{"a rotated token and a refused one, rebinding off", with(bearer, func(a *Access) { a.UpstreamRefused, a.RebindOff = true, true }), Deny},
	} {
		if got := Authorize(c.a); got != c.want {
			t.Errorf("%s: Authorize(%+v) = %v, want %v", c.name, c.a, got, c.want)
		}
	}
}

func TestDecideRebind(t *testing.T) {
	alice, bob := Principal{Known: true, Hash: [32]byte{1}}, Principal{Known: true, Hash: [32]byte{2}}
	opaque := Principal{}
	for _, c := range []struct {
		name string
		in   RebindInput
		want RebindAction
	}{
		{"the upstream's 401 reaches the client", RebindInput{Verdict: Refused, Bound: alice, Offered: alice}, RelayRefusal},
		{"the upstream's 401 on a recheck", RebindInput{Verdict: Refused, CredentialMatch: true, Kind: ReadsLog}, RelayRefusal},
		{"the upstream's 401 whatever the mode", RebindInput{Mode: RebindUpstream, Verdict: Refused}, RelayRefusal},
		{"the upstream lost the session: its 404, the session kept", RebindInput{Verdict: SessionLost, Bound: alice, Offered: alice}, RelayRefusal},
		{"claims an upstream that verifies nothing accepted", RebindInput{Verdict: Accepted, Bound: alice, Offered: alice, AnonymousAccepted: true}, DenyUnverifiable},
		{"opaque tokens an upstream that verifies nothing accepted, trusting it", RebindInput{Mode: RebindUpstream, Verdict: Accepted, AnonymousAccepted: true}, DenyUnverifiable},
		{"no verdict on a resume", RebindInput{Verdict: Unverified, Bound: alice, Offered: alice, Kind: ReadsLog}, Unavailable},
		{"no verdict on a call", RebindInput{Verdict: Unverified, Bound: alice, Offered: alice, Kind: Call}, Unavailable},
		{"no verdict on a DELETE", RebindInput{Verdict: Unverified, Kind: EndSession}, Unavailable},
		{"the bound token accepted again", RebindInput{Verdict: Accepted, CredentialMatch: true, Bound: opaque, Kind: ReadsLog}, Proceed},
		{"a refreshed JWT of the same subject", RebindInput{Verdict: Accepted, Bound: alice, Offered: alice, Kind: Call}, Rebind},
		{"a refreshed JWT, on a resume", RebindInput{Verdict: Accepted, Bound: alice, Offered: alice, Kind: ReadsLog}, Rebind},
		{"another subject's valid JWT on a call", RebindInput{Verdict: Accepted, Bound: alice, Offered: bob, Kind: Call}, DenyPrincipal},
		{"another subject's valid JWT on a resume", RebindInput{Verdict: Accepted, Bound: alice, Offered: bob, Kind: ReadsLog}, DenyPrincipal},
		{"another subject's valid JWT on a DELETE", RebindInput{Verdict: Accepted, Bound: alice, Offered: bob, Kind: EndSession}, DenyPrincipal},
		{"another subject, even trusting the upstream", RebindInput{Mode: RebindUpstream, Verdict: Accepted, Bound: alice, Offered: bob}, DenyPrincipal},
		{"opaque tokens on a resume", RebindInput{Verdict: Accepted, Bound: opaque, Offered: opaque, Kind: ReadsLog}, DenyUnverifiable},
		{"opaque tokens on a call", RebindInput{Verdict: Accepted, Bound: opaque, Offered: opaque, Kind: Call}, DenyUnverifiable},
		{"opaque tokens on a DELETE", RebindInput{Verdict: Accepted, Bound: opaque, Offered: opaque, Kind: EndSession}, DenyUnverifiable},
		{"a token where there was none", RebindInput{Verdict: Accepted, Bound: opaque, Offered: alice, Kind: Call}, DenyUnverifiable},
		{"no token where there was one", RebindInput{Verdict: Accepted, Bound: alice, Offered: opaque, Kind: ReadsLog}, DenyUnverifiable},
		{"a JWT replacing an opaque token", RebindInput{Verdict: Accepted, Bound: opaque, Offered: alice, Kind: ReadsLog}, DenyUnverifiable},
		{"opaque tokens, trusting the upstream", RebindInput{Mode: RebindUpstream, Verdict: Accepted, Bound: opaque, Offered: opaque, Kind: ReadsLog}, Rebind},
		{"an opaque token replacing a JWT, trusting the upstream", RebindInput{Mode: RebindUpstream, Verdict: Accepted, Bound: alice, Offered: opaque}, Rebind},
	} {
		if got := DecideRebind(c.in); got != c.want {
			t.Errorf("%s: DecideRebind(%+v) = %v, want %v", c.name, c.in, got, c.want)
		}
		_ = c.want.String()
	}
}
