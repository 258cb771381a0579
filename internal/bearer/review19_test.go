package bearer

import "testing"

// FINDING (low): Subject reads claims with encoding/json into a struct,
// which matches member names case-insensitively, the last match winning:
// {"sub":"mallory","Sub":"alice"} names alice to the proxy while every
// JWT library that reads claims as a map (jose, PyJWT, golang-jwt's
// MapClaims) and the upstream's authorization see "mallory". An issuer
// that lets a user shape a custom claim whose name differs from "sub" or
// "iss" only by case would let her take over another subject's sessions.
// Read the claims as a map[string]json.RawMessage, exact names.
func TestReview19ClaimNamesAreCaseSensitive(t *testing.T) {
	for _, payload := range []string{
		`{"iss":"https://as","sub":"mallory","Sub":"alice"}`,
		`{"iss":"https://as","sub":"mallory","SUB":"alice"}`,
		`{"ISS":"https://as","Sub":"alice"}`,
	} {
		if _, sub, ok := Subject("Bearer " + jwt(payload)); ok && sub == "alice" {
			t.Errorf("%s: Subject says alice; a map-reading verifier says the subject is %s", payload, "mallory or none")
		}
	}
}
