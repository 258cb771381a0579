package caddymodule

import "testing"

// caddy validate refuses bind values that can never bind
// anyone: a placeholder with its closing brace missing (a literal, the
// same for every request), a "placeholder" that is only braces, and a
// rebind mode for a binding without bearer (rebind never applies: a
// silently dead option). Each should be a validation error naming it.
func TestBindValuesThatBindNobodyAreInvalid(t *testing.T) {
	for _, h := range []Handler{
		{Bind: []string{"{http.auth.user.id"}},
		{Bind: []string{"http.auth.user.id}"}},
		{Bind: []string{"{}"}},
		{Bind: []string{"{http.auth.user.id}"}, Rebind: "upstream"},
	} {
		h.setDefaults()
		if err := h.Validate(); err == nil {
			t.Errorf("bind %q rebind %q: valid, want an error (it binds every request to the same value, or rebind is dead)", h.Bind, h.Rebind)
		}
	}
}
