package resume

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"hash"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/bearer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// vouchTimeout bounds the upstream's answer to a credential check.
const vouchTimeout = 10 * time.Second

// maxRefusalBody bounds what is relayed of the upstream's refusal.
const maxRefusalBody = 64 << 10

// identity is the keyed hash of the request's values for the identity part
// of a binding: every entry but bearer. A header name (bind_headers) hashes
// as it always has, so sessions bound before bind existed still match.
func (h *Engine) identity(r *http.Request, bind []string) [32]byte {
	mac := h.mac()
	defer h.rt.macs.Put(mac)
	for _, entry := range bind {
		switch {
		case entry == BindBearer:
			continue
		case strings.Contains(entry, "{"):
			mac.writeString(entry, "\x00", h.placeholders(r, entry), "\x00")
		default:
			for _, v := range r.Header.Values(entry) {
				mac.writeString(entry, "\x00", v, "\x00")
			}
		}
		mac.writeString("\x01")
	}
	var fp [32]byte
	mac.Sum(fp[:0])
	return fp
}

// keyedMAC is an HMAC-SHA256 under the store's key, kept for reuse in
// Runtime.macs: every request hashes its identity, and making a hasher
// costs six allocations.
type keyedMAC struct {
	key []byte
	hash.Hash
	buf []byte // what writeString copies a string into: no allocation per write
}

// writeString writes the parts to the hash.
func (m *keyedMAC) writeString(parts ...string) {
	m.buf = m.buf[:0]
	for _, p := range parts {
		m.buf = append(m.buf, p...)
	}
	m.Write(m.buf)
}

// mac returns a reset hasher under the store's key; the caller puts it
// back in h.rt.macs once done.
func (h *Engine) mac() *keyedMAC {
	key := h.rt.store.Key()
	if m, _ := h.rt.macs.Get().(*keyedMAC); m != nil && bytes.Equal(m.key, key) {
		m.Reset()
		return m
	}
	return &keyedMAC{key: key, Hash: hmac.New(sha256.New, key)}
}

// HeaderPlaceholders replaces the placeholders in s the way Caddy does for
// {http.request.header.X} (the header's values joined with ","), and every
// other placeholder with "": the engine's default Config.Placeholders.
func HeaderPlaceholders(r *http.Request, s string) string {
	var b strings.Builder
	for {
		open := strings.IndexByte(s, '{')
		if open < 0 {
			break
		}
		end := strings.IndexByte(s[open:], '}')
		if end < 0 {
			break
		}
		b.WriteString(s[:open])
		if name, ok := strings.CutPrefix(s[open+1:open+end], "http.request.header."); ok {
			b.WriteString(strings.Join(r.Header.Values(name), ","))
		}
		s = s[open+end+1:]
	}
	b.WriteString(s)
	return b.String()
}

// credential is the keyed hash of the request's bearer credential and of
// the principal it names, if the proxy can tell (a JWT's iss and sub; the
// upstream verifies the signature before the proxy relies on it).
func (h *Engine) credential(r *http.Request) buffer.Credential {
	c := buffer.Credential{Hash: h.credentialHash(r)}
	if values := r.Header.Values("Authorization"); len(values) == 1 {
		if iss, sub, ok := bearer.Subject(values[0]); ok {
			mac := h.mac()
			mac.Write([]byte("principal\x00" + iss + "\x00" + sub))
			mac.Sum(c.Principal.Hash[:0])
			h.rt.macs.Put(mac)
			c.Principal.Known = true
		}
	}
	return c
}

// credentialHash is the keyed hash of the request's Authorization values
// alone: all a request with the bound token needs, so the token is decoded
// only when it changed.
func (h *Engine) credentialHash(r *http.Request) (sum [32]byte) {
	values := r.Header.Values("Authorization")
	if len(values) == 0 {
		return sum
	}
	mac := h.mac()
	defer h.rt.macs.Put(mac)
	mac.writeString("bearer\x00")
	for _, v := range values {
		mac.writeString(v, "\x00")
	}
	mac.Sum(sum[:0])
	return sum
}

// newBinding is what a session r begins is bound with (sessionMeta, its
// version and origin to come), and whether its identity came out empty
// (identityMissing): a session bound to nothing would be anyone's.
func (h *Engine) newBinding(r *http.Request) (meta buffer.SessionMeta, empty bool) {
	return h.sessionMeta(r, "", 0), h.identityMissing(r)
}

// sessionMeta is what a new session is bound with: the request's identity
// and credential under this handler's binding, and the endpoint it began on.
func (h *Engine) sessionMeta(r *http.Request, version string, origin policy.SessionOrigin) buffer.SessionMeta {
	bind := h.binding()
	m := buffer.SessionMeta{Version: version, Fingerprint: h.identity(r, bind),
		Bind: append([]string(nil), bind...), Endpoint: r.URL.RequestURI(), Origin: origin}
	if hasBearer(bind) {
		m.Credential = h.credential(r)
	}
	return m
}

// identityMissing reports whether a binding of placeholders alone came out
// empty for the request: an authentication handler that should set them
// did not run before this one (or a placeholder is misspelt), and a
// session bound to nothing would be anyone's.
func (h *Engine) identityMissing(r *http.Request) bool {
	bind := h.binding()
	if hasBearer(bind) {
		return false
	}
	for _, entry := range bind {
		if !strings.Contains(entry, "{") {
			return false // a header name (bind_headers): an absent header is the client's choice
		}
		if h.placeholders(r, entry) != stripPlaceholders(entry) {
			return false // this one has a value
		}
	}
	return true
}

// stripPlaceholders is entry without its placeholders: what it replaces to
// when every one of them is empty.
func stripPlaceholders(entry string) string {
	var b strings.Builder
	depth := 0
	for _, c := range entry {
		switch {
		case c == '{':
			depth++
		case c == '}' && depth > 0:
			depth--
		case depth == 0:
			b.WriteRune(c)
		}
	}
	return b.String()
}

func hasBearer(bind []string) bool {
	for _, e := range bind {
		if e == BindBearer {
			return true
		}
	}
	return false
}

// bound is what the proxy holds of the session a request names: the
// session itself, or the tombstone of one that ended here.
type bound struct {
	sess buffer.Session // nil for a tombstone
	meta buffer.SessionMeta
}

// authorize checks that a request naming a session carries its identity
// and a credential the upstream accepts for it (policy.Authorize), and
// reports whether it goes on; when it does not, the client has its answer.
func (h *Engine) authorize(w http.ResponseWriter, r *http.Request, next Next, sid string,
	kind policy.RequestKind) (goOn bool, err error) {
	_, goOn, err = h.authorizeSeen(w, r, next, sid, kind)
	return goOn, err
}

// allowed reports whether r may act on session sid as the store holds it
// now, by its binding alone: for a request the upstream has answered
// already, which nothing can refuse or vouch for any more.
func (h *Engine) allowed(r *http.Request, sid string) bool {
	a, _, err := h.access(r, sid, policy.Call)
	return err == nil && policy.Authorize(a) == policy.Allow
}

// authorizeSeen is authorize, also returning the session it found (nil if
// none). A serving path that finds a session where this found none (one
// created meanwhile: an adoption, another replica's) authorizes again
// (reauthorize): a request passed for an unknown session is unchecked.
func (h *Engine) authorizeSeen(w http.ResponseWriter, r *http.Request, next Next, sid string,
	kind policy.RequestKind) (seen buffer.Session, goOn bool, err error) {
	a, b, lerr := h.access(r, sid, kind)
	if lerr != nil {
		// Not a session unknown: one the store could not read, maybe
		// bound to another credential. Nothing passes on a guess.
		h.logger.Warn("request refused: the store could not read its session", zap.String("session", sid), zap.Error(lerr))
		return nil, false, h.refuse(w, refuseUnavailable, to{sid: sid, lastID: r.Header.Get(hdrLastEventID)})
	}
	seen = b.sess
	switch policy.Authorize(a) {
	case policy.Deny:
		lastID := r.Header.Get(hdrLastEventID)
		if r.Method == http.MethodGet && lastID != "" {
			resumes.WithLabelValues(policy.Reject.String()).Inc()
		}
		return seen, false, h.refuse(w, refuseCredentials, to{sid: sid, lastID: lastID})
	case policy.Vouch:
		if goOn, err = h.vouch(w, r, next, sid, a, b); !goOn {
			return seen, goOn, err
		}
	}
	if b.sess != nil && a.Bearer {
		// Only a credential the binding checks (the one bound, or one the
		// upstream just vouched for): under a binding of other values any
		// token passes here, and one the upstream then refuses must not
		// become what a takeover carries.
		h.rt.freshest.note(b.sess, r)
	}
	return seen, true, nil
}

// reauthorize authorizes a request again once a serving path found its
// session other than authorizeSeen saw it: where it saw none (seen nil), or
// another incarnation (the session deleted and made again in between, bound
// to whoever made it); it reports whether the request goes on, and when it
// does not, the client has its answer.
func (h *Engine) reauthorize(w http.ResponseWriter, r *http.Request, next Next, sid string,
	kind policy.RequestKind, seen, found buffer.Session) (goOn bool, err error) {
	if found == nil || seen != nil && sameBinding(seen, found) {
		return true, nil
	}
	return h.authorize(w, r, next, sid, kind)
}

// sameBinding reports whether a and b are one incarnation of a session,
// bound alike. The epoch names the incarnation (a new one never takes an
// epoch its session's remembered past holds); the binding is compared too,
// for one made again more often than that past remembers.
func sameBinding(a, b buffer.Session) bool {
	if a.Epoch() != b.Epoch() {
		return false
	}
	ma, mb := a.Meta(), b.Meta()
	return ma.Fingerprint == mb.Fingerprint && ma.Credential.Hash == mb.Credential.Hash
}

// access is what the proxy knows of the session a request names, for
// policy.Authorize.
func (h *Engine) access(r *http.Request, sid string, kind policy.RequestKind) (policy.Access, bound, error) {
	a := policy.Access{Named: sid != "", Kind: kind, RebindOff: h.rebindMode() == policy.RebindOff}
	if !a.Named {
		return a, bound{}, nil
	}
	var b bound
	sess, err := buffer.LookupSession(h.rt.store, sid)
	if err != nil {
		return a, b, err
	}
	if sess != nil {
		b = bound{sess: sess, meta: sess.Meta()}
	} else if tomb, ok := h.rt.store.Tombstone(sid); ok {
		b.meta = buffer.SessionMeta{Version: tomb.Version, Fingerprint: tomb.Fingerprint, Bind: tomb.Bind,
			Credential: tomb.Credential}
	} else {
		return a, b, nil
	}
	a.Remembered = true
	got := h.identity(r, b.meta.Bind)
	a.IdentityMatch = hmac.Equal(got[:], b.meta.Fingerprint[:])
	// A session that is never tapped has no log to protect: its identity is
	// checked, its credential is the upstream's alone.
	a.Bearer = hasBearer(b.meta.Bind) && b.meta.Origin != policy.Untapped
	var sum [32]byte
	if a.Bearer {
		sum = h.credentialHash(r)
		a.CredentialMatch = hmac.Equal(sum[:], b.meta.Credential.Hash[:])
	}
	if b.sess != nil && h.rt.freshest.hasRefusals(sid) {
		if !a.Bearer {
			sum = h.credentialHash(r)
		}
		a.UpstreamRefused = h.rt.freshest.refused(sid, sum)
	}
	return a, b, nil
}

// vouch asks the upstream whether it accepts the request's credential for
// the session (policy.Authorize said Vouch) and acts on policy.DecideRebind.
// It reports whether the request goes on as the session's owner's; when it
// does not, the client has its answer.
func (h *Engine) vouch(w http.ResponseWriter, r *http.Request, next Next, sid string,
	a policy.Access, b bound) (goOn bool, err error) {
	verdict, answer := h.askUpstream(r, next, sid, b.meta, false)
	offered := h.credential(r)
	// Under a binding without the bearer, the credential is not the
	// binding's to judge: one the upstream accepts again is a recheck.
	in := policy.RebindInput{Mode: h.rebindMode(), Verdict: verdict, CredentialMatch: a.CredentialMatch || !a.Bearer,
		Bound: b.meta.Credential.Principal, Offered: offered.Principal, Kind: a.Kind}
	act := policy.DecideRebind(in)
	if act == policy.Rebind && len(r.Header.Values("Authorization")) > 0 {
		// Before a token takes a session over, make sure the upstream
		// verifies tokens at all: one that accepts none accepts forged ones.
		anon, _ := h.askUpstream(r, next, sid, b.meta, true)
		in.AnonymousAccepted = anon == policy.Accepted
		act = policy.DecideRebind(in)
	}
	credentialChecks.WithLabelValues(act.String()).Inc()
	fields := []zap.Field{zap.String("session", sid), zap.String("method", r.Method), zap.String("outcome", act.String())}
	switch act {
	case policy.Proceed:
		if a.UpstreamRefused {
			h.rt.freshest.accepted(sid, h.credentialHash(r)) // the takeover may try it again
		}
		return true, nil
	case policy.Rebind:
		if b.sess != nil {
			switch err := b.sess.Rebind(offered); {
			case errors.Is(err, buffer.ErrSessionGone):
				// Ended meanwhile (its DELETE, the upstream's 404): the
				// request goes to the upstream, which answers for itself.
				return false, next.ServeHTTP(w, r)
			case err != nil:
				h.logger.Warn("session not rebound: the store could not record it", append(fields, zap.Error(err))...)
				return false, h.refuse(w, refuseUnavailable, to{sid: sid})
			}
		}
		h.logger.Info("session rebound to a refreshed credential the upstream accepted", fields...)
		return true, nil
	case policy.RelayRefusal:
		h.logger.Info("credential refused by the upstream: its answer goes to the client",
			append(fields, zap.Int("status", answer.status))...)
		answer.relay(w)
		return false, nil
	case policy.DenyPrincipal:
		h.logger.Warn("changed credential refused: it names another principal than the session's", fields...)
		return false, h.refuse(w, refusePrincipal, to{sid: sid, lastID: r.Header.Get(hdrLastEventID)})
	case policy.DenyUnverifiable:
		h.logger.Warn("changed credential refused: the proxy cannot tell it names the session's principal (not a JWT, or an upstream that verifies no token); rebind upstream trusts the upstream for opaque tokens", append(fields, zap.Bool("upstream_accepts_no_token", in.AnonymousAccepted))...)
		return false, h.refuse(w, refuseUnverifiable, to{sid: sid, lastID: r.Header.Get(hdrLastEventID)})
	default: // Unavailable
		h.logger.Warn("credential not checked: the upstream gave no verdict", append(fields, zap.Int("status", answer.status))...)
		return false, h.refuse(w, refuseUnchecked, to{sid: sid})
	}
}

var pingIDs atomic.Uint64

// atEndpoint points req at endpoint (a session's, as it began: path and
// query), if known: what the proxy asks the upstream on a session's behalf
// goes there, whatever path under the route the client used.
func atEndpoint(req *http.Request, endpoint string) {
	if endpoint == "" {
		return
	}
	if u, err := url.ParseRequestURI(endpoint); err == nil {
		req.URL.Path, req.URL.RawPath, req.URL.RawQuery = u.Path, u.RawPath, u.RawQuery
		req.RequestURI = endpoint
	}
}

// askUpstream sends a JSON-RPC ping on the session to the upstream, on the
// endpoint the session began on (never the request's own path: any path
// under the route reaches this handler, and another endpoint's answer says
// nothing of the session), with the request's headers (its credentials
// among them, or none when anonymous), and reads the upstream's verdict. A
// refusal comes back whole, for the client.
func (h *Engine) askUpstream(r *http.Request, next Next, sid string, meta buffer.SessionMeta,
	anonymous bool) (policy.Verdict, *recorded) {
	body := []byte(`{"jsonrpc":"2.0","id":"mcp-resume-check-` + strconv.FormatUint(pingIDs.Add(1), 10) + `","method":"ping"}`)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), vouchTimeout)
	defer cancel()
	req := r.Clone(ctx)
	atEndpoint(req, meta.Endpoint)
	req.Method = http.MethodPost
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	req.ContentLength = int64(len(body))
	for _, name := range []string{hdrLastEventID, "Accept-Encoding", "Content-Length", "Transfer-Encoding"} {
		req.Header.Del(name)
	}
	if anonymous {
		req.Header.Del("Authorization")
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if req.Header.Get(hdrVersion) == "" && meta.Version >= "2025-06-18" {
		req.Header.Set(hdrVersion, meta.Version)
	}
	rec := &recorded{header: http.Header{}, accepted: func() {
		// The verdict is in; a body that does not end soon (a stream the
		// upstream holds open) is not waited for.
		time.AfterFunc(acceptedGrace, cancel)
	}}
	err := func() (err error) {
		defer func() {
			if p := recover(); p == http.ErrAbortHandler {
				err = http.ErrAbortHandler // the upstream's answer broke off
			} else if p != nil {
				panic(p)
			}
		}()
		return next.ServeHTTP(rec, req)
	}()
	verdict := policy.Classify(rec.status).Verdict()
	if verdict == policy.Unverified && err != nil {
		h.logger.Debug("credential check failed", zap.String("session", sid), zap.Error(err))
	}
	return verdict, rec
}

// acceptedGrace is how long the body of an accepted check may take to end.
const acceptedGrace = time.Second

// recorded is the upstream's answer to a credential check.
type recorded struct {
	header   http.Header
	status   int
	body     []byte
	accepted func() // called once a 2xx status arrives
}

func (rc *recorded) Header() http.Header { return rc.header }

func (rc *recorded) WriteHeader(status int) {
	if rc.status == 0 && status >= 200 {
		rc.status = status
		if status/100 == 2 && rc.accepted != nil {
			rc.accepted()
		}
	}
}

func (rc *recorded) Write(p []byte) (int, error) {
	if rc.status == 0 {
		rc.WriteHeader(http.StatusOK)
	}
	if room := maxRefusalBody - len(rc.body); room > 0 {
		rc.body = append(rc.body, p[:min(len(p), room)]...)
	}
	return len(p), nil
}

func (rc *recorded) Flush() {}

// relay gives the client the upstream's refusal as the upstream sent it:
// its status, WWW-Authenticate and body are what make SDK clients refresh.
func (rc *recorded) relay(w http.ResponseWriter) {
	for k, v := range rc.header {
		switch k {
		case "Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive", "Upgrade", "Trailer",
			"Proxy-Connection", "Te", hdrSessionID:
			continue
		}
		w.Header()[k] = v
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(rc.body)))
	w.WriteHeader(rc.status)
	w.Write(rc.body)
}

// binding is what a session is bound to, as configured: bind, or the
// header names of bind_headers.
func (c *Config) binding() []string {
	if c.Bind != nil {
		return c.Bind
	}
	return c.BindHeaders
}

// rebindMode is the configured rebind mode.
func (c *Config) rebindMode() policy.RebindMode {
	if m, ok := policy.RebindModes[c.Rebind]; ok {
		return m
	}
	return policy.RebindSubject
}

// freshest remembers, per session, the Authorization a request of it last
// brought that the proxy let through (its binding's, or one the upstream
// vouched for), in this process's memory only: the store keeps no
// credential. What the proxy asks the upstream on the session's behalf
// later (a takeover's GET, a reconnect) carries it rather than an older
// request's, whose token may have expired since. It also remembers the
// credentials the upstream refused on such a GET (refuse): a client that
// comes back with one gets the upstream's verdict, not the log.
type freshest struct {
	mu sync.Mutex
	m  map[string]*sessionCredentials
}

type sessionCredentials struct {
	auth    []string   // the freshest Authorization values
	refused [][32]byte // keyed hashes (credentialHash), newest last, at most maxRefused
}

// maxRefused bounds the refused credentials remembered per session: a
// client refreshes each one once.
const maxRefused = 4

// entry returns sess's credentials, made (and forgotten when sess ends)
// if need be; under f.mu.
func (f *freshest) entry(sess buffer.Session) *sessionCredentials {
	sid := sess.ID()
	if c, ok := f.m[sid]; ok {
		return c
	}
	if f.m == nil {
		f.m = make(map[string]*sessionCredentials)
	}
	c := &sessionCredentials{}
	f.m[sid] = c
	context.AfterFunc(sess.Context(), func() {
		f.mu.Lock()
		delete(f.m, sid)
		f.mu.Unlock()
	})
	return c
}

// note records r's Authorization for sess.
func (f *freshest) note(sess buffer.Session, r *http.Request) {
	values := r.Header.Values("Authorization")
	if len(values) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.m[sess.ID()]; ok && slices.Equal(c.auth, values) {
		return
	}
	f.entry(sess).auth = slices.Clone(values)
}

// with returns r, or a copy of it carrying the freshest Authorization
// noted for sess if that is another.
func (f *freshest) with(r *http.Request, sess buffer.Session) *http.Request {
	f.mu.Lock()
	var values []string
	if c, ok := f.m[sess.ID()]; ok {
		values = c.auth
	}
	f.mu.Unlock()
	if values == nil || slices.Equal(values, r.Header.Values("Authorization")) {
		return r
	}
	r = r.Clone(r.Context())
	r.Header["Authorization"] = slices.Clone(values)
	return r
}

// refuse records that the upstream refused the credential with hash sum
// for sess (401 or 403 to a GET the proxy made with it, confirmed by a
// check of the same credential).
func (f *freshest) refuse(sess buffer.Session, sum [32]byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.entry(sess)
	if slices.Contains(c.refused, sum) {
		return
	}
	if len(c.refused) == maxRefused {
		c.refused = slices.Delete(c.refused, 0, 1)
	}
	c.refused = append(c.refused, sum)
}

// hasRefusals reports whether the upstream refused any credential of sid:
// only then is a request's credential hashed to look it up.
func (f *freshest) hasRefusals(sid string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.m[sid]
	return ok && len(c.refused) > 0
}

// refused reports whether the upstream refused the credential with hash
// sum for sid.
func (f *freshest) refused(sid string, sum [32]byte) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.m[sid]
	return ok && slices.Contains(c.refused, sum)
}

// accepted forgets a refusal of the credential with hash sum: the upstream
// accepted it since.
func (f *freshest) accepted(sid string, sum [32]byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.m[sid]; ok {
		c.refused = slices.DeleteFunc(c.refused, func(x [32]byte) bool { return x == sum })
	}
}
