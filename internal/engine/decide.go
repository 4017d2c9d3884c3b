package engine

import (
	"context"
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
	// CredHeader is the header the API key came in ("" when none), and
	// AlsoCredHeader the other one when a key came in both clients.header
	// and Authorization: Bearer: the door strips both when clients.strip
	// is set, so that neither reaches the upstream.
	CredHeader, AlsoCredHeader string
	// Detail is the problem detail of a 401 or a 500, and of a 429 for a
	// request costing more than a policy admits at once ("" for other
	// 429s: the detail says when to retry).
	Detail string

	// The matching policies' decisions, in configuration order: the first
	// eight in buf, all of them in more when there are more. (A slice of
	// buf kept in the Verdict would make every Verdict escape to the heap.)
	n    int
	buf  [8]Taken
	more []Taken
}

// Takes returns the matching policies' decisions, in configuration order.
func (v *Verdict) Takes() []Taken {
	if v.more != nil {
		return v.more
	}
	return v.buf[:v.n]
}

// VerdictOf is a Verdict over takes a door decided itself (with TakeAll),
// for the Verdict's renderings (Tightest, Denials, Deny). A denial by a
// limit the request's cost can never fit says so in its Detail, as a
// Check's does.
func VerdictOf(o Outcome, takes []Taken) Verdict {
	v := Verdict{Outcome: o, more: takes[:len(takes):len(takes)]}
	if o == OverLimit {
		for i := range takes {
			if t := &takes[i]; !t.OK && !t.Policy.Shadow && t.Units > t.Limit.MaxCost() {
				v.Detail = costDetail(t)
				break
			}
		}
	}
	return v
}

// add appends a policy's decision.
func (v *Verdict) add(t Taken) {
	switch {
	case v.more != nil:
		v.more = append(v.more, t)
	case v.n < len(v.buf):
		v.buf[v.n] = t
		v.n++
	default:
		v.more = append(append(make([]Taken, 0, 2*len(v.buf)), v.buf[:v.n]...), t)
	}
}

// clearTakes forgets the decisions, when the request is refused before any
// quota is taken.
func (v *Verdict) clearTakes() { v.n, v.more = 0, nil }

// truncate keeps the first n decisions: those TakeAll asked.
func (v *Verdict) truncate(n int) {
	if v.more != nil {
		v.more = v.more[:n]
		return
	}
	v.n = n
}

// Decide decides req at now into v. It returns an error only when a
// limiter failed in a way no policy setting covers (the door answers with
// an internal error), or with the context's error when the caller gave up
// while its request was held (v.Outcome is Canceled).
func (e *Engine) Decide(ctx context.Context, req *Request, now time.Time, v *Verdict) error {
	*v = Verdict{}

	// 1. Identify the caller. A presented key that is not known is a 401
	// before any policy runs, and leaves no state behind.
	caller, credHeader, also, detail := e.identify(req)
	v.Client, v.CredHeader, v.AlsoCredHeader = caller, credHeader, also
	if credHeader != "" && e.authFail != nil {
		// clients.auth_failures: an address that presented too many
		// unknown keys is refused whatever key it presents now.
		if decided, err := e.limitAuthFailures(ctx, req, caller, now, v); decided || err != nil {
			return err
		}
	}
	if detail != "" {
		v.Outcome, v.Detail = Unauthorized, detail
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
		if len(v.Takes()) == MaxPoliciesPerRequest {
			e.warnTooMany(ctx)
			v.Outcome, v.Detail = Failed, tooManyDetail
			v.clearTakes()
			return nil
		}
		key, missing := p.partition(req, caller, e.ip)
		if missing && p.OnMissingKey == config.MissingReject {
			v.Outcome, v.Detail = Unauthorized, missingDetail(p)
			v.clearTakes()
			return nil
		}
		l := e.limitOf(ctx, p, req, caller)
		units := e.units(ctx, p, req)
		if l.Overdraft {
			// Check cannot see the response: under charge: always it
			// only asks whether budget is left, and the rate limit
			// service charges what the response reports.
			units = 0
		}
		if units > l.MaxCost() && !p.Shadow {
			neverFits = true
		}
		v.add(Taken{Policy: p, Key: key, Limit: l, Units: units})
	}

	// A request costing more than an enforcing policy can ever grant is
	// denied before any limiter is asked: nothing is taken, nothing to
	// refund.
	if neverFits {
		e.denyTooCostly(v)
		return nil
	}

	// 3. Ask the policies for the request's cost, in configuration order,
	// all or nothing (the first enforcing denial ends the decision), and
	// hold an allowed request for its leaky-bucket slot.
	outcome, asked, err := TakeAll(ctx, v.Takes(), now, e.hold)
	v.Outcome = outcome
	v.truncate(asked)
	return err
}

// denyTooCostly denies a request that costs more than an enforcing policy
// can ever grant, asking no limiter: those policies deny (shadow ones
// would have), the others are left unasked, as allowed with nothing taken.
func (e *Engine) denyTooCostly(v *Verdict) {
	takes := v.Takes()
	for i := range takes {
		t := &takes[i]
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

// identify returns the client holding the presented API key, the header
// it came in, the other header when a key came in both clients.header and
// Authorization: Bearer, and the 401 detail when what was presented names
// no client ("" when a client was found or no key was presented). Two keys
// are one credential only when they are the same key: otherwise one would
// be checked and the other passed to the upstream unchecked. A key longer
// than identity.MaxKeyLen is never hashed. With no keys configured, API
// keys are not in use and nothing is read.
func (e *Engine) identify(r *Request) (c *Client, header, also, detail string) {
	if e.keyring.Len() == 0 {
		return nil, "", "", ""
	}
	key := strings.TrimSpace(r.Headers[e.keyHeader])
	var bearer string
	var hasBearer bool
	if e.cfg.Clients.Bearer && e.keyHeader != "authorization" {
		bearer, hasBearer = identity.Bearer(r.Headers["authorization"])
	}
	switch {
	case key != "" && hasBearer:
		header, also = e.keyHeader, "authorization"
		if key != bearer {
			return nil, header, also, twoKeys
		}
	case key != "":
		header = e.keyHeader
	case hasBearer:
		header, key = "authorization", bearer
	default:
		return nil, "", "", ""
	}
	if len(key) > identity.MaxKeyLen {
		return nil, header, also, keyTooLong
	}
	if c = e.keyring.Lookup(key); c == nil {
		return nil, header, also, "Unknown API key."
	}
	return c, header, also, ""
}

// twoKeys is the 401 detail for different keys in clients.header and
// Authorization: Bearer.
const twoKeys = "Two different API keys: clients.header and Authorization: Bearer must carry the same key, or only one of them."

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
	takes := v.Takes()
	for i := range takes {
		t := &takes[i]
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
// describe it, so the client is told one consistent time. Decide stops at
// the first enforcing denial, so of the policies it asked, one denied.
func (v *Verdict) Denials() (worst *Taken, names []string) {
	takes := v.Takes()
	for i := range takes {
		t := &takes[i]
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
