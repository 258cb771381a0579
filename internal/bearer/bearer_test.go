package bearer

import (
	"encoding/base64"
	"strings"
	"testing"
)

func jwt(payload string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + enc([]byte(payload)) + ".c2ln"
}

func TestSubject(t *testing.T) {
	for _, c := range []struct {
		name, header, iss, sub string
		ok                     bool
	}{
		{"a JWT", "Bearer " + jwt(`{"iss":"https://as","sub":"alice","exp":1}`), "https://as", "alice", true},
		{"scheme in any case", "bearer " + jwt(`{"sub":"alice"}`), "", "alice", true},
		{"padded payload", "Bearer " + strings.Replace(jwt(`{"sub":"al"}`), ".c2ln", "", 1) + "==.c2ln", "", "al", true},
		{"no subject", "Bearer " + jwt(`{"iss":"https://as"}`), "", "", false},
		{"a subject that is no string", "Bearer " + jwt(`{"sub":7}`), "", "", false},
		{"an opaque token", "Bearer 2YotnFZFEjr1zCsicMWpAA", "", "", false},
		{"basic auth", "Basic YWxhZGRpbjpvcGVuc2VzYW1l", "", "", false},
		{"no token", "Bearer", "", "", false},
		{"two parts", "Bearer a.b", "", "", false},
		{"payload not base64", "Bearer a.!!!.c", "", "", false},
		{"payload not JSON", "Bearer a." + base64.RawURLEncoding.EncodeToString([]byte("nope")) + ".c", "", "", false},
		{"too long", "Bearer " + jwt(`{"sub":"`+strings.Repeat("a", maxToken)+`"}`), "", "", false},
	} {
		iss, sub, ok := Subject(c.header)
		if iss != c.iss || sub != c.sub || ok != c.ok {
			t.Errorf("%s: Subject(%q) = %q, %q, %v; want %q, %q, %v", c.name, c.header, iss, sub, ok, c.iss, c.sub, c.ok)
		}
	}
}

// FuzzSubject: any header value is answered without panicking, and a
// subject is only ever read from a three-part Bearer token.
func FuzzSubject(f *testing.F) {
	f.Add("Bearer " + jwt(`{"iss":"i","sub":"s"}`))
	f.Add("Bearer a.b.c")
	f.Add("Basic x")
	f.Add("Bearer " + jwt(`{"sub":{"a":1}}`))
	f.Fuzz(func(t *testing.T, header string) {
		_, sub, ok := Subject(header)
		if ok && (sub == "" || strings.Count(header, ".") < 2) {
			t.Fatalf("Subject(%q) = %q, true", header, sub)
		}
	})
}

// Claim names are exact, as verifiers that read claims as a map see them,
// and a claims set naming iss or sub twice names nobody.
func TestSubjectReadsExactClaimNames(t *testing.T) {
	for _, c := range []struct {
		payload, sub string
		ok           bool
	}{
		{`{"iss":"https://as","sub":"mallory","Sub":"alice"}`, "mallory", true},
		{`{"iss":"https://as","sub":"mallory","SUB":"alice"}`, "mallory", true},
		{`{"ISS":"https://as","Sub":"alice"}`, "", false},
		{`{"sub":"alice","sub":"mallory"}`, "", false},
		{`{"sub":"alice","iss":"a","iss":"b"}`, "", false},
		{`{"sub":"alice","iss":7}`, "", false},
		{`{"sub":"al\u0069ce","nested":{"sub":"x"}}`, "alice", true},
		{`{"sub":"alice"} trailing`, "", false},
		{` {"sub":"alice"} `, "alice", true},
	} {
		_, sub, ok := Subject("Bearer " + jwt(c.payload))
		if sub != c.sub || ok != c.ok {
			t.Errorf("%s: Subject = %q, %v; want %q, %v", c.payload, sub, ok, c.sub, c.ok)
		}
	}
}
