// Package bearer reads what a proxy may read of an OAuth bearer credential
// without verifying it: whether it is a JWT, and which issuer and subject it
// names. Verifying is the upstream's job (mcp-resume asks it); these claims
// only tell whether a refreshed token names the same principal as the one it
// replaces.
package bearer

import (
	"bytes"
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
	iss, sub, ok = claims(payload)
	if !ok || sub == "" {
		return "", "", false
	}
	return iss, sub, true
}

// claims reads iss and sub from a JWT's claims set as the verifiers that
// read claims as a map do: exact member names. A set that names either
// twice, or not as a string, is refused: parsers disagree on which one
// counts, and the proxy must read the principal the upstream verified.
func claims(payload []byte) (iss, sub string, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return "", "", false
	}
	var seenIss, seenSub bool
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return "", "", false
		}
		name, _ := t.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return "", "", false
		}
		var dst *string
		switch name {
		case "iss":
			if seenIss {
				return "", "", false
			}
			seenIss, dst = true, &iss
		case "sub":
			if seenSub {
				return "", "", false
			}
			seenSub, dst = true, &sub
		default:
			continue
		}
		if json.Unmarshal(raw, dst) != nil {
			return "", "", false
		}
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('}') || int(dec.InputOffset()) != len(bytes.TrimRight(payload, " \t\r\n")) {
		return "", "", false
	}
	return iss, sub, true
}
