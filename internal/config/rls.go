package config

import "fmt"

// validateRLS checks the rls section. The domain files themselves are
// read and checked by internal/rlsconfig, with their own file names in
// the errors; Parse resolves the paths against the configuration's
// directory.
func validateRLS(r *rawRLS, errs *Errors) RLS {
	c := RLS{Domains: r.Domains, ResponseHeaders: true, OnUndecodable: UndecodableDeny, ShadowMode: r.ShadowMode, QuotaMode: r.QuotaMode, DynamicMetadata: r.DynamicMetadata}
	if r.ResponseHeaders != nil {
		c.ResponseHeaders = *r.ResponseHeaders
	}
	switch r.OnUndecodable {
	case "":
	case UndecodableDeny, UndecodableAllow:
		c.OnUndecodable = r.OnUndecodable
	default:
		errs.add("rls.on_undecodable", "%q is not an answer; choices are %s (OVER_LIMIT, the default), %s (OK)", r.OnUndecodable, UndecodableDeny, UndecodableAllow)
	}
	switch r.Counting {
	case "":
		c.Counting = CountingAllOrNothing
	case CountingAllOrNothing, CountingEach, CountingEachStopWhenOver:
		c.Counting = r.Counting
	default:
		errs.add("rls.counting", "%q is not a way of counting; choices are %s (the default: a request denied by one descriptor spends nothing from the others), %s (envoyproxy/ratelimit's: every descriptor counts, the one over its limit included), %s (as %s, but when a descriptor is over only the ones over count: the anchor's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT)",
			r.Counting, CountingAllOrNothing, CountingEach, CountingEachStopWhenOver, CountingEach)
	}
	for i, d := range r.Domains {
		if d == "" {
			errs.add(fmt.Sprintf("rls.domains[%d]", i), "is empty; give a file or a directory of envoyproxy/ratelimit configurations")
		}
	}
	if h := r.LimitHeaders; h != nil {
		c.LimitHeaders = &LimitHeaders{Limit: "RateLimit-Limit", Remaining: "RateLimit-Remaining", Reset: "RateLimit-Reset"}
		for _, f := range []struct {
			name string
			raw  string
			dst  *string
		}{{"limit", h.Limit, &c.LimitHeaders.Limit}, {"remaining", h.Remaining, &c.LimitHeaders.Remaining}, {"reset", h.Reset, &c.LimitHeaders.Reset}} {
			if f.raw == "" {
				continue
			}
			if !headerToken(f.raw) {
				errs.add("rls.limit_headers."+f.name, "%q is not a header name", f.raw)
			}
			*f.dst = f.raw
		}
	}
	return c
}

// headerToken reports whether s is an HTTP header name (RFC 9110 token).
func headerToken(s string) bool {
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case r < 0x80 && r > 0x20 && !isSeparator(byte(r)):
		default:
			return false
		}
	}
	return s != ""
}

func isSeparator(b byte) bool {
	switch b {
	case '(', ')', '<', '>', '@', ',', ';', ':', '\\', '"', '/', '[', ']', '?', '=', '{', '}':
		return true
	}
	return false
}
