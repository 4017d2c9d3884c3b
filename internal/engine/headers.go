package engine

import (
	"slices"

	"github.com/extauthz/extauthz/internal/config"
)

// RequestHeaders returns the lower-case names of the request headers a
// decision of e reads from Request.Headers: the API key header and
// authorization (bearer keys) when keys are configured, x-forwarded-for
// when an ip key looks behind trusted hops, and every header a policy keys
// on (header:NAME) or reads a cost or a limit from. A door that builds
// Request.Headers itself from a protocol's own header map needs these
// alone; the slice is shared, read only.
func (e *Engine) RequestHeaders() []string { return e.headers }

// requestHeaders lists what identify and keyValue read, for
// RequestHeaders.
func requestHeaders(cfg *config.Config, keyHeader string, keys int) []string {
	var names []string
	add := func(n string) {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	if keys > 0 {
		add(keyHeader)
		if cfg.Clients.Bearer {
			add("authorization")
		}
		if cfg.Clients.AuthFailures != nil && cfg.IPTrustedHops > 0 {
			add("x-forwarded-for") // the failures' address (authfail.go)
		}
	}
	keyPart := func(k config.KeyPart) {
		switch {
		case k.Kind == config.KeyHeader:
			add(k.Name)
		case k.Kind == config.KeyIP && cfg.IPTrustedHops > 0:
			add("x-forwarded-for")
		}
	}
	for _, p := range cfg.Policies {
		for _, k := range p.Key {
			keyPart(k)
		}
		keyPart(p.PlanFrom)
		if p.Cost.From == config.CostHeader {
			add(p.Cost.Name)
		}
		if p.LimitFrom.From == config.CostHeader {
			add(p.LimitFrom.Name)
		}
		for m := &p.Match; m != nil; m = m.Not {
			for _, h := range m.Headers {
				add(h.Name)
			}
			if len(m.SourceCIDRs) > 0 && cfg.IPTrustedHops > 0 {
				add("x-forwarded-for")
			}
		}
	}
	return names
}
