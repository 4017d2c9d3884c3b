package engine

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/identity"
	"github.com/extauthz/extauthz/internal/quota"
)

// Outcome is how a decision ended, as extauthz_checks_total counts it.
type Outcome uint8

// The outcomes.
const (
	OK           Outcome = iota // allowed
	OverLimit                   // 429: an enforcing policy denied
	Unauthorized                // 401: unknown or overlong API key, or a required key part missing
	Unavailable                 // 503: on_redis_error deny while Redis is unreachable
	Canceled                    // the caller gave up while its request was held
	Failed                      // 500 (too many policies) or a limiter's internal error
	outcomeCount
)

var outcomeNames = [outcomeCount]string{"ok", "over_limit", "unauthorized", "unavailable", "canceled", "error"}

func (o Outcome) String() string { return outcomeNames[o] }

// MaxPoliciesPerRequest is the most policies one request may match. Each
// matched policy is one quota decision (in redis mode, one Redis round
// trip), taken one after another inside the proxy's timeout. A request
// that matches more is refused with a 500 before any quota is taken: the
// configuration is at fault, not the caller, and an answer that enforced
// only some of the policies would be wrong.
const MaxPoliciesPerRequest = 32

// Taken is one policy's decision for the request in hand.
type Taken struct {
	Policy   *Policy
	Key      string // the partition key
	Limit    Limit  // the limit that applied (the caller's plan's, for limit: plan)
	Units    int64  // the units asked for: the request's cost (1 unless configured; 0 asks without spending)
	OK       bool   // allowed (for a shadow policy: would have been)
	Decision quota.Decision
}

// Verdict is a decision's result, for the door to render. Decide fills a
// Verdict the door owns, so the hot path allocates nothing for it.
type Verdict struct {
	Outcome Outcome
	Client  *Client // the verified caller; nil when anonymous
	// CredHeader is the header the API key came in ("" when none): the
	// door strips it when clients.strip is set.
	CredHeader string
	// Detail is the problem detail of a 401 or a 500, and of a 429 for a
	// request costing more than a policy admits at once ("" for other
	// 429s: the detail says when to retry).
	Detail string
	// Takes are the matching policies' decisions, in configuration order.
	Takes []Taken

	buf [8]Taken
}

// Decide decides req at now into v. It returns an error only when a
// limiter failed in a way no policy setting covers (the door answers with
// an internal error), or with the context's error when the caller gave up
// while its request was held (v.Outcome is Canceled).
func (e *Engine) Decide(ctx context.Context, req *Request, now time.Time, v *Verdict) error {
	*v = Verdict{}
	v.Takes = v.buf[:0]

	// 1. Identify the caller. A presented key that is not known is a 401
	// before any policy runs, and leaves no state behind.
	caller, credHeader, keyLen := e.identify(req)
	v.Client, v.CredHeader = caller, credHeader
	if credHeader != "" && caller == nil {
		v.Outcome, v.Detail = Unauthorized, "Unknown API key."
		if keyLen > identity.MaxKeyLen {
			v.Detail = keyTooLong
		}
		return nil
	}

	// 2. Find the policies that apply, their partition keys and what the
	// request costs under each. All are known before any quota is taken,
	// so a rejection needs no refunds.
	neverFits := false
	for _, p := range e.policies {
		if !p.matches(req, e.cfg.IPTrustedHops) {
			continue
		}
		if len(v.Takes) == MaxPoliciesPerRequest {
			e.warnTooMany(ctx)
			v.Outcome, v.Detail, v.Takes = Failed, tooManyDetail, v.Takes[:0]
			return nil
		}
		key, missing := p.partition(req, caller, e.cfg.IPTrustedHops)
		if missing && p.OnMissingKey == config.MissingReject {
			v.Outcome, v.Detail, v.Takes = Unauthorized, missingDetail(p), v.Takes[:0]
			return nil
		}
		l := p.limitFor(req, caller)
		units := e.units(ctx, p, req)
		if units > l.MaxCost() && !p.Shadow {
			neverFits = true
		}
		v.Takes = append(v.Takes, Taken{Policy: p, Key: key, Limit: l, Units: units})
	}

	// A request costing more than an enforcing policy can ever grant is
	// denied before any limiter is asked: nothing is taken, nothing to
	// refund.
	if neverFits {
		e.denyTooCostly(v)
		return nil
	}

	// 3. Ask every policy for the request's cost, recording the key's
	// use for the counters API's top keys.
	denied := false
	ns := now.UnixNano()
	for i := range v.Takes {
		t := &v.Takes[i]
		t.Policy.top.Observe(t.Key, ns, int32(t.Limit.Index))
		if t.Limit.Unlimited {
			t.Decision, t.OK = quota.Decision{Allowed: true}, true
			t.Policy.unlimited.Inc()
			continue
		}
		if t.Policy.Shadow && t.Units > t.Limit.MaxCost() { // it would have denied (an enforcing policy's denied the request above)
			t.Decision = tooCostly(t.Limit)
			t.Policy.shadowDenied.Inc()
			continue
		}
		d, err := t.Policy.limiter.Take(ctx, t.Key, t.Limit.Limit, t.Units, now)
		if err != nil {
			e.refund(ctx, v.Takes[:i], now)
			v.Outcome = Failed
			return fmt.Errorf("policy %s: %w", t.Policy.Name, err)
		}
		t.Decision, t.OK = d, d.Allowed
		if d.Degraded != quota.NotDegraded {
			t.Policy.degraded[d.Degraded].Inc()
		}
		switch {
		case d.Allowed:
			t.Policy.allowed.Inc()
		case t.Policy.Shadow:
			t.Policy.shadowDenied.Inc()
		default:
			t.Policy.denied.Inc()
			denied = true
		}
	}

	// 4. A request denied by one policy consumes nothing from the others.
	if denied {
		e.refund(ctx, v.Takes, now)
		v.Outcome = OverLimit
		if unavailable(v.Takes) {
			v.Outcome = Unavailable
		}
		return nil
	}
	if err := e.holdAllowed(ctx, v.Takes, now); err != nil {
		v.Outcome = Canceled
		return err
	}
	v.Outcome = OK
	return nil
}

// denyTooCostly denies a request that costs more than an enforcing policy
// can ever grant, asking no limiter: those policies deny (shadow ones
// would have), the others are left unasked, as allowed with nothing taken.
func (e *Engine) denyTooCostly(v *Verdict) {
	for i := range v.Takes {
		t := &v.Takes[i]
		if t.Units <= t.Limit.MaxCost() { // unlimited limits included
			t.OK = true
			continue
		}
		t.Decision = tooCostly(t.Limit)
		if t.Policy.Shadow {
			t.Policy.shadowDenied.Inc()
			continue
		}
		t.Policy.denied.Inc()
		if v.Detail == "" {
			v.Detail = costDetail(t)
		}
	}
	v.Outcome = OverLimit
}

// refund gives back the units that allowed policies took.
func (e *Engine) refund(ctx context.Context, takes []Taken, now time.Time) {
	for i := range takes {
		t := &takes[i]
		if t.OK && t.Units > 0 && !t.Limit.Unlimited {
			_ = t.Policy.limiter.Refund(ctx, t.Key, t.Limit.Limit, t.Units, now)
			t.Policy.refunded.Inc()
		}
	}
}

// identify returns the client holding the presented API key, the header it
// came in and its length. A key that is presented but unknown (or longer
// than identity.MaxKeyLen, which is never hashed) yields (nil, header, n).
// With no keys configured, API keys are not in use and nothing is read.
func (e *Engine) identify(r *Request) (*Client, string, int) {
	if e.keyring.Len() == 0 {
		return nil, "", 0
	}
	if v := strings.TrimSpace(r.Headers[e.keyHeader]); v != "" {
		return e.keyring.Lookup(v), e.keyHeader, len(v)
	}
	if e.cfg.Clients.Bearer {
		if v, ok := identity.Bearer(r.Headers["authorization"]); ok {
			return e.keyring.Lookup(v), "authorization", len(v)
		}
	}
	return nil, "", 0
}

// keyTooLong is the 401 detail for a presented key over identity.MaxKeyLen.
var keyTooLong = "API key longer than " + strconv.Itoa(identity.MaxKeyLen) + " bytes."

var tooManyDetail = "The request matches more than " + strconv.Itoa(MaxPoliciesPerRequest) +
	" rate limit policies; the sidecar's configuration must be fixed."

// warnTooMany logs the first request under a configuration that matched
// too many policies.
func (e *Engine) warnTooMany(ctx context.Context) {
	if e.warn != nil && e.warnedTooMany.CompareAndSwap(false, true) {
		e.warn.LogAttrs(ctx, slog.LevelWarn, "request matches too many policies; answering 500 (logged once per configuration)",
			slog.Int("max", MaxPoliciesPerRequest), slog.Int("policies", len(e.policies)), slog.String("config", e.cfg.Source))
	}
}

// unavailable reports whether every enforcing denial came from
// on_redis_error: deny, not from a count. A real over-limit answer wins.
func unavailable(takes []Taken) bool {
	for i := range takes {
		t := &takes[i]
		if !t.OK && !t.Policy.Shadow && t.Decision.Degraded != quota.DegradedDeny {
			return false
		}
	}
	return true
}

// Tightest is the most constrained enforcing policy of an allowed request
// (fewest remaining, then the longest reset): the one its RateLimit
// headers describe. Nil when no enforcing policy matched.
func (v *Verdict) Tightest() *Taken {
	var tightest *Taken
	for i := range v.Takes {
		t := &v.Takes[i]
		if t.Policy.Shadow || t.Limit.Unlimited {
			continue // shadow policies observe, unlimited ones count; clients never see them
		}
		if tightest == nil || t.Decision.Remaining < tightest.Decision.Remaining ||
			(t.Decision.Remaining == tightest.Decision.Remaining && t.Decision.ResetAfter > tightest.Decision.ResetAfter) {
			tightest = t
		}
	}
	return tightest
}

// Denials returns the enforcing policies that denied, by name, and the one
// with the longest wait: a 429's Retry-After and RateLimit headers
// describe it, so the client is told one consistent time.
func (v *Verdict) Denials() (worst *Taken, names []string) {
	for i := range v.Takes {
		t := &v.Takes[i]
		if t.OK || t.Policy.Shadow {
			continue
		}
		names = append(names, t.Policy.Name)
		if worst == nil || t.Decision.RetryAfter > worst.Decision.RetryAfter {
			worst = t
		}
	}
	return worst, names
}
