package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/quota"
)

// AuthFailuresPolicy names the limit on unknown API keys per client
// address (clients.auth_failures) wherever a policy's name appears: the
// RateLimit headers and violated-policies of its 429, the decision
// metrics. It starts with '_', which no policy's name may, so it can share
// neither a policy's name nor its keys.
const AuthFailuresPolicy = "_auth_failures"

// compileAuthFailures compiles clients.auth_failures, when set, into a
// policy of its own: a token bucket per client address (the ip key part,
// under the same ip_trusted_hops and prefixes as policies), counted by
// the local limiter, which must be able to Peek.
func (e *Engine) compileAuthFailures(af *config.Plan, limiters Limiters, m *Metrics) error {
	lim := limiters[config.ModeLocal]
	peek, ok := lim.(quota.Peeker)
	if !ok {
		return fmt.Errorf("clients.auth_failures: the local limiter %T cannot peek", lim)
	}
	pc := config.Policy{
		Name:         AuthFailuresPolicy,
		Key:          []config.KeyPart{{Kind: config.KeyIP}},
		Limit:        af.Limit,
		Window:       af.Window,
		Burst:        af.Burst,
		Algorithm:    config.TokenBucket,
		Mode:         config.ModeLocal,
		OnRedisError: config.OnErrorFallback,
		OnMissingKey: config.MissingAnonymous,
	}
	e.authFail = &Policy{
		Policy:          pc,
		Index:           len(e.policies),
		limiter:         lim,
		fixed:           e.newLimit(pc, af.Limit, af.Window, af.Burst, nil),
		prefix:          AuthFailuresPolicy,
		decisionMetrics: m.forPolicy(AuthFailuresPolicy, string(config.ModeLocal)),
	}
	e.authPeek = peek
	return nil
}

// limitAuthFailures applies clients.auth_failures to a request presenting
// an API key; it reports whether that decided the verdict (a 429).
//
// While the caller's address has failures left, an unknown key spends one
// (and goes on to its 401) and a known key spends nothing and creates no
// state. Once they are spent, every key the address presents is refused
// with a 429, the right one too: were a right key answered differently
// from a wrong one, guessing would go on at full speed with the 429s
// marking the wrong guesses. Requests without a key are not affected:
// they guess nothing.
func (e *Engine) limitAuthFailures(ctx context.Context, req *Request, caller *Client, now time.Time, v *Verdict) (bool, error) {
	p := e.authFail
	key, _ := p.partition(req, nil, e.ip)
	var d quota.Decision
	var err error
	if caller != nil {
		d, err = e.authPeek.Peek(ctx, key, p.fixed.Limit, now)
	} else {
		d, err = p.limiter.Take(ctx, key, p.fixed.Limit, 1, now)
	}
	if err != nil {
		v.Outcome = Failed
		return true, fmt.Errorf("%s: %w", p.Name, err)
	}
	switch {
	case d.Allowed && caller == nil:
		p.allowed.Inc() // a failure, counted and let through to its 401
		return false, nil
	case d.Allowed:
		return false, nil
	}
	p.denied.Inc()
	v.Outcome = OverLimit
	v.clearTakes()
	v.add(Taken{Policy: p, Key: key, Limit: p.fixed, Units: 1, Decision: d})
	return true, nil
}
