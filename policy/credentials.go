package policy

// A session is bound to who its owner is, never to the bytes of a token that
// rotates. The binding has two parts:
//
//   - the identity: values that stay the same for the session's life (a
//     user ID an authentication handler in front of the proxy verified, a
//     header of the operator's choosing). Another value is another owner: 403.
//   - the bearer credential: the Authorization header, which only the
//     upstream verifies and which OAuth clients refresh every few minutes.
//     The proxy cannot judge it alone, so the upstream vouches: nothing from
//     a log is served under a credential the upstream has not accepted for
//     the session, and a changed one is taken over (the session rebound)
//     only when it names the same principal as the bound one.

// RequestKind is what a request could get from the proxy's logs.
type RequestKind uint8

const (
	Call       RequestKind = iota // a POST: goes upstream; its answer is tapped, or a repeat is answered from a log
	ReadsLog                      // a GET text/event-stream: a resume or the standalone stream, answered from a log
	EndSession                    // a DELETE: goes upstream; nothing comes from a log
	OtherKind                     // anything else naming the session: passes through
)

// Access is what the proxy knows of the session a request names.
type Access struct {
	Named      bool // the request carries Mcp-Session-Id
	Remembered bool // the proxy holds that session, or remembers it ended here
	// IdentityMatch: the request's bound identity values (bind placeholders
	// and headers) are the session's.
	IdentityMatch bool
	// Bearer: the session's binding includes its bearer credential.
	Bearer bool
	// CredentialMatch: the request's Authorization is the one bound (both
	// absent counts as a match).
	CredentialMatch bool
	// UpstreamRefused: the upstream refused the request's credential (401
	// or 403) on a GET the proxy made for the session with it (a takeover,
	// a reconnect), so it is not to be answered from the log on its say.
	UpstreamRefused bool
	// RebindOff: the operator turned rebinding off: a changed credential is
	// another owner, as the binding of the proxy's first versions had it.
	RebindOff bool
	Kind      RequestKind
}

// AccessDecision is Authorize's answer.
type AccessDecision uint8

const (
	Allow AccessDecision = iota // go on
	Deny                        // 403: another owner
	// Vouch: the upstream must accept the request's credential for the
	// session before anything from a log is served (then DecideRebind).
	Vouch
)

func (d AccessDecision) String() string {
	return [...]string{"allow", "deny", "vouch"}[d]
}

// Authorize decides whether a request may go on. One naming a session the
// proxy holds or remembers must carry that session's identity, whatever its
// method, version, content type or body, so no path around the binding
// exists. A bearer credential other than the bound one is the upstream's to
// judge first. The bound one is the owner's even once it has expired: a
// resume under it is answered from the log (the upstream refuses it on the
// next call, and the client refreshes then), because an SDK client that
// gets a 401 on a resume retries without its Last-Event-ID and loses the
// call (TypeScript SDK 1.32.2). Once the upstream itself refused a
// credential on the session (UpstreamRefused), whatever the binding, the
// upstream judges it first: its 401 is what makes the client refresh.
func Authorize(a Access) AccessDecision {
	switch {
	case !a.Named || !a.Remembered:
		return Allow
	case !a.IdentityMatch:
		return Deny
	case a.UpstreamRefused && (!a.Bearer || a.CredentialMatch):
		return Vouch
	case !a.Bearer:
		return Allow
	case !a.CredentialMatch && a.RebindOff:
		return Deny
	case !a.CredentialMatch:
		return Vouch
	}
	return Allow
}

// RebindMode is how a changed bearer credential may take a session over.
type RebindMode uint8

const (
	// RebindSubject: when the upstream accepts it and both it and the bound
	// one are JWTs naming the same issuer and subject. An opaque token's
	// principal cannot be told, so it is never rebound.
	RebindSubject RebindMode = iota
	// RebindUpstream: when the upstream accepts it, whatever it is, unless
	// both are JWTs naming different subjects. For opaque tokens in front of
	// an upstream that binds its sessions to their user itself (as the Go
	// SDK does).
	RebindUpstream
	// RebindOff: never; a changed credential gets 403 (Authorize).
	RebindOff
)

// RebindModes are the names the configuration takes, by mode.
var RebindModes = map[string]RebindMode{"subject": RebindSubject, "upstream": RebindUpstream, "off": RebindOff}

// Verdict is how the upstream answered the proxy's check of a credential (a
// JSON-RPC ping on the session, sent with the request's headers).
type Verdict uint8

const (
	Accepted    Verdict = iota // 2xx
	Refused                    // 401 or 403: the client must refresh or step up
	SessionLost                // 404: the upstream does not know the session (or the endpoint)
	Unverified                 // anything else: the upstream could not say
)

// Principal is what the proxy can tell of whom a bearer credential names.
type Principal struct {
	Known bool     // the token is a JWT with an issuer and a subject
	Hash  [32]byte // keyed hash of issuer and subject
}

// RebindInput is what DecideRebind needs.
type RebindInput struct {
	Mode            RebindMode
	Verdict         Verdict
	CredentialMatch bool      // the request's credential is the bound one (a recheck, not a rotation)
	Bound, Offered  Principal // the principal of the bound credential, and of the request's
	// AnonymousAccepted: the upstream accepted the same check with no
	// credential at all, so it verifies none and no claim means anything.
	AnonymousAccepted bool
	Kind              RequestKind
}

// RebindAction is DecideRebind's answer.
type RebindAction uint8

const (
	Proceed          RebindAction = iota // serve the request as the session's owner's
	Rebind                               // bind the session to the request's credential, then Proceed
	RelayRefusal                         // give the client the upstream's answer unchanged (its 401 makes SDK clients refresh)
	DenyPrincipal                        // 403: the credential names another principal
	DenyUnverifiable                     // 403: the proxy cannot tell the principal (an opaque token under RebindSubject)
	Unavailable                          // 503: the upstream could not vouch now; retry
)

func (a RebindAction) String() string {
	return [...]string{"accepted", "rebound", "refused_upstream", "refused_principal", "refused_unverifiable",
		"unverified"}[a]
}

// DecideRebind decides what a request Authorize sent to the upstream for
// vouching gets, from the upstream's verdict and what the proxy can tell of
// the principals. The upstream's refusal always reaches the client as the
// upstream gave it; its 404 too, and the session is not ended for it: only
// a request the binding let through may end a session. A credential the upstream accepted takes the session
// over only if it names the bound principal; when the proxy cannot tell
// (opaque tokens), only RebindUpstream trusts the upstream's word, since an
// upstream that does not bind its sessions to users accepts anyone's valid
// token. Refusals apply to every method: a call under another principal
// would run in the owner's session.
func DecideRebind(in RebindInput) RebindAction {
	switch in.Verdict {
	case Refused, SessionLost:
		return RelayRefusal
	case Unverified:
		return Unavailable
	}
	switch {
	case in.CredentialMatch:
		return Proceed // the bound credential, accepted again
	case in.AnonymousAccepted:
		return DenyUnverifiable // the upstream verifies nothing: claims are anyone's to write
	case in.Bound.Known && in.Offered.Known && in.Bound.Hash == in.Offered.Hash:
		return Rebind
	case in.Bound.Known && in.Offered.Known:
		return DenyPrincipal
	case in.Mode == RebindUpstream:
		return Rebind
	}
	return DenyUnverifiable
}
