package mcptest

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
)

// JWTIssuer mints HS256 JWTs (claims iss, sub, exp and a jti that makes
// every token distinct) and verifies them, as an authorization server and
// the resource server that trusts it would: what tests of rotating bearer
// credentials need, without an OAuth server.
type JWTIssuer struct {
	Issuer string
	key    []byte
	n      atomic.Uint64
}

// NewJWTIssuer returns an issuer with a random key.
func NewJWTIssuer(issuer string) *JWTIssuer {
	key := make([]byte, 32)
	rand.Read(key)
	return &JWTIssuer{Issuer: issuer, key: key}
}

var b64 = base64.RawURLEncoding

// Mint returns a token for sub that expires after ttl.
func (j *JWTIssuer) Mint(sub string, ttl time.Duration) string {
	claims, _ := json.Marshal(map[string]any{"iss": j.Issuer, "sub": sub,
		"exp": time.Now().Add(ttl).Unix(), "jti": fmt.Sprint(j.n.Add(1))})
	signing := b64.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + b64.EncodeToString(claims)
	return signing + "." + b64.EncodeToString(j.sign(signing))
}

func (j *JWTIssuer) sign(s string) []byte {
	mac := hmac.New(sha256.New, j.key)
	mac.Write([]byte(s))
	return mac.Sum(nil)
}

// Verify is an auth.TokenVerifier: a token j minted, unexpired, gives the
// TokenInfo of its subject; anything else is auth.ErrInvalidToken.
func (j *JWTIssuer) Verify(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return nil, fmt.Errorf("%w: not a JWT", auth.ErrInvalidToken)
	}
	sig, err := b64.DecodeString(parts[2])
	if err != nil || !hmac.Equal(sig, j.sign(parts[0]+"."+parts[1])) {
		return nil, fmt.Errorf("%w: bad signature", auth.ErrInvalidToken)
	}
	payload, err := b64.DecodeString(parts[1])
	if err != nil {
		return nil, fmt.Errorf("%w: bad payload", auth.ErrInvalidToken)
	}
	var c struct {
		Iss string `json:"iss"`
		Sub string `json:"sub"`
		Exp int64  `json:"exp"`
	}
	if err := json.Unmarshal(payload, &c); err != nil || c.Iss != j.Issuer || c.Sub == "" {
		return nil, fmt.Errorf("%w: bad claims", auth.ErrInvalidToken)
	}
	exp := time.Unix(c.Exp, 0)
	if !time.Now().Before(exp) {
		return nil, fmt.Errorf("%w: expired", auth.ErrInvalidToken)
	}
	return &auth.TokenInfo{UserID: c.Sub, Expiration: exp}, nil
}

// Protect puts h behind the Go SDK's auth.RequireBearerToken with j's
// verifier, as an MCP resource server does: 401 with WWW-Authenticate
// (resource_metadata) for a missing or invalid token; the SDK's streamable
// handler then binds each session to the token's subject.
func (j *JWTIssuer) Protect(h http.Handler) http.Handler {
	return auth.RequireBearerToken(j.Verify, &auth.RequireBearerTokenOptions{
		ResourceMetadataURL: "http://127.0.0.1/.well-known/oauth-protected-resource/mcp",
	})(h)
}

// RotatingToken is a client's token source for one subject that mints a
// new token every Every (and on Rotate), as an OAuth client refreshing
// short-lived access tokens does.
type RotatingToken struct {
	Issuer *JWTIssuer
	Sub    string
	Every  time.Duration // 0: only Rotate mints a new token
	TTL    time.Duration // each token's life; 0: a minute

	mu     sync.Mutex
	tok    string
	minted time.Time
	count  int
}

// Token returns the current token, minting a new one if it is due.
func (r *RotatingToken) Token() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.tok == "" || (r.Every > 0 && time.Since(r.minted) >= r.Every) {
		r.mintLocked()
	}
	return r.tok
}

// Rotate mints a new token now and returns it.
func (r *RotatingToken) Rotate() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mintLocked()
	return r.tok
}

func (r *RotatingToken) mintLocked() {
	ttl := r.TTL
	if ttl == 0 {
		ttl = time.Minute
	}
	r.tok, r.minted = r.Issuer.Mint(r.Sub, ttl), time.Now()
	r.count++
}

// Minted returns how many tokens were minted so far.
func (r *RotatingToken) Minted() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count
}

// Transport sends every request through next with Authorization: Bearer
// and the current token.
func (r *RotatingToken) Transport(next http.RoundTripper) http.RoundTripper {
	return RoundTripFunc(func(req *http.Request) (*http.Response, error) {
		req = req.Clone(req.Context())
		req.Header.Set("Authorization", "Bearer "+r.Token())
		return next.RoundTrip(req)
	})
}
