package config

import "fmt"

// validateRLS checks the rls section. The domain files themselves are
// read and checked by internal/rlsconfig, with their own file names in
// the errors; Parse resolves the paths against the configuration's
// directory.
func validateRLS(r *rawRLS, errs *Errors) RLS {
	c := RLS{Domains: r.Domains, ResponseHeaders: true, OnUndecodable: UndecodableDeny}
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
	for i, d := range r.Domains {
		if d == "" {
			errs.add(fmt.Sprintf("rls.domains[%d]", i), "is empty; give a file or a directory of envoyproxy/ratelimit configurations")
		}
	}
	return c
}
