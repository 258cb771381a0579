// Package bearer reads what a proxy may read of an OAuth bearer credential
// without verifying it: whether it is a JWT, and which issuer and subject it
// names. Verifying is the upstream's job (mcp-resume asks it); these claims
// only tell whether a refreshed token names the same principal as the one it
// replaces.
package bearer

import (
	"encoding/base64"
	"encoding/json"
	"strings"
)

// maxToken bounds what is decoded: access tokens are a few KiB at most.
const maxToken = 16 << 10

// Subject returns the issuer and subject of an Authorization header value
// "Bearer <JWT>" (RFC 6750, RFC 7519), and false for anything else: another
// scheme, an opaque token, a JWT without a subject. The signature is not
// checked.
func Subject(authorization string) (iss, sub string, ok bool) {
	scheme, token, found := strings.Cut(strings.TrimSpace(authorization), " ")
	if !found || !strings.EqualFold(scheme, "Bearer") || len(token) > maxToken {
		return "", "", false
	}
	token = strings.TrimSpace(token)
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" {
		return "", "", false
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return "", "", false
	}
	var claims struct {
		Iss any `json:"iss"`
		Sub any `json:"sub"`
	}
	if json.Unmarshal(payload, &claims) != nil {
		return "", "", false
	}
	iss, _ = claims.Iss.(string)
	sub, _ = claims.Sub.(string)
	if sub == "" {
		return "", "", false
	}
	return iss, sub, true
}
