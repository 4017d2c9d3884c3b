package engine

import (
	"strings"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/identity"
)

// matchMore tests the conditions beyond path, method, host and context:
// headers, verified claims, the client's network, and what must not match.
func matchMore(m *config.Match, a *Request, hops int) bool {
	for i := range m.Headers {
		h := &m.Headers[i]
		v, ok := a.Headers[h.Name]
		if !valueMatches(h, v, ok) {
			return false
		}
	}
	for i := range m.Claims {
		c := &m.Claims[i]
		v, ok := a.claim(c.Name)
		if !valueMatches(c, v, ok) {
			return false
		}
	}
	if len(m.SourceCIDRs) > 0 {
		addr, ok := identity.ClientAddr(a.Peer, a.Headers["x-forwarded-for"], hops)
		if !ok {
			return false
		}
		in := false
		for _, p := range m.SourceCIDRs {
			if p.Contains(addr) {
				in = true
				break
			}
		}
		if !in {
			return false
		}
	}
	return m.Not == nil || !matchAll(m.Not, a, hops)
}

// valueMatches tests one condition on a value that is present (ok) or not.
func valueMatches(vm *config.ValueMatch, v string, ok bool) bool {
	switch vm.Kind {
	case config.MatchPresent:
		return ok
	case config.MatchAbsent:
		return !ok
	case config.MatchExact:
		return ok && v == vm.Value
	case config.MatchPrefix:
		return ok && strings.HasPrefix(v, vm.Value)
	case config.MatchRegex:
		return ok && vm.Regexp.MatchString(v)
	}
	return false
}
