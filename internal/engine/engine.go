// Package engine makes the decision every door asks for: who the caller
// is, which policies apply, and whether each admits one more unit. A door
// (the gRPC ext_authz Check in internal/check, the HTTP endpoint in
// internal/httpauth) turns its protocol's request into a Request, calls
// Decide, and renders the Verdict in its protocol, using the header values
// and problem bodies of render.go, so every door answers alike. Envoy's
// rate limit service (internal/rls), whose requests name descriptors
// rather than a caller, compiles its descriptor files into Policies with
// NewPolicy, takes a request's with TakeAll, and answers with render.go
// too.
//
// A Check's path: Decide identifies the caller (API key by SHA-256 digest:
// an unknown key is a 401 before any policy runs), finds the matching
// policies and their partition keys (all built before any quota is
// taken), asks each policy's limiter for one unit, refunds what was taken
// when any enforcing policy denies, and holds an allowed request for its
// leaky-bucket slot.
package engine

import (
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/identity"
	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/topkeys"
)

// Limiters maps each mode to the limiter that keeps its counts.
type Limiters map[config.Mode]quota.Limiter

// Engine is one compiled configuration. It is immutable (but for the flag
// that logs a warning once): a reload compiles a new Engine and Running
// swaps it in for every door, so a decision sees one configuration
// throughout. It is safe for concurrent use.
type Engine struct {
	cfg       *config.Config
	keyring   *identity.Keyring[Client]
	clients   []*Client
	keyHeader string   // clients.header, lower case
	headers   []string // what decisions read of Request.Headers (RequestHeaders)
	ip        identity.IPRule
	policies  []*Policy    // matched in this order
	all       []*Policy    // policies, then authFail when set: what a door renders
	limits    int          // Limits compiled, numbered 0..limits-1
	authFail  *Policy      // clients.auth_failures (authfail.go); nil when not set
	authPeek  quota.Peeker // authFail's limiter
	metrics   *Metrics
	hold      HoldFunc     // waits out a leaky bucket's delay
	warn      *slog.Logger // nil: warnings are not logged
	usage     *Usage       // each policy's recent key use, for the counters API

	warnedTooMany atomic.Bool // a MaxPoliciesPerRequest refusal was logged
}

// Client is a known API key holder.
type Client struct {
	ID    string
	Plan  string // "" when none
	Index int    // 0..len(Engine.Clients())-1, for a door's per-client values
}

// Policy is one compiled policy.
type Policy struct {
	config.Policy
	Index   int // 0..len(Engine.Policies())-1, for a door's per-policy values
	limiter quota.Limiter
	fixed   Limit            // the policy's own limit, unless UsePlan; LimitFrom's default
	ceiling Limit            // LimitFrom's max; zero when the limit is not read per request
	plans   map[string]Limit // UsePlan: by plan name; "" holds plans.default
	prefix  string           // partition key prefix: the escaped name
	decisionMetrics
	costReader *costReader // nil for a constant cost
	// limitReader counts limits read per request that were defaulted or
	// clamped; nil when the limit is not read per request.
	limitReader *limitReader
	unlimited   prometheus.Counter // decisions of unlimited limits; nil when the policy has none
	// unknownPlan counts plan_from names that are not plans; nil
	// without plan_from.
	unknownPlan prometheus.Counter
	top         *topkeys.Tracker // recent use of the policy's keys
}

// Limit is a quota.Limit with its RateLimit-Policy header value rendered
// once.
type Limit struct {
	quota.Limit
	Header string // `"orders";q=100;w=60`
	Index  int    // 0..Engine.LimitCount()-1, for a door's per-limit values
}

// MaxCost is the most units one request may take under l: a token
// bucket's capacity, else the limit; no bound for an unlimited limit, or
// for one that charges (charge: always), whose takes are never refused.
func (l *Limit) MaxCost() int64 {
	switch {
	case l.Unlimited, l.Overdraft:
		return math.MaxInt64
	case l.Algorithm == quota.TokenBucket:
		return l.Capacity()
	}
	return l.Limit.Limit
}

// Option configures an Engine.
type Option func(*Engine)

// WithHold replaces how an admitted request is held until its leaky bucket
// slot (a timer by default). Tests pass a recorder, so no test sleeps.
func WithHold(hold HoldFunc) Option { return func(e *Engine) { e.hold = hold } }

// WithWarnings logs, once per configuration, a request that matches more
// than MaxPoliciesPerRequest policies.
func WithWarnings(log *slog.Logger) Option { return func(e *Engine) { e.warn = log } }

// Compile translates cfg into an engine deciding with the given limiters,
// one per mode the configuration uses: this is the one place configuration
// values become quota values.
func Compile(cfg *config.Config, limiters Limiters, m *Metrics, opts ...Option) (*Engine, error) {
	e := &Engine{
		cfg:       cfg,
		keyring:   identity.NewKeyring[Client](len(cfg.Clients.Keys)),
		keyHeader: cfg.Clients.Header,
		ip:        identity.IPRule{TrustedHops: cfg.IPTrustedHops, IPv4Prefix: cfg.IPv4Prefix, IPv6Prefix: cfg.IPv6Prefix},
		metrics:   m,
		hold:      sleepCtx,
	}
	for _, o := range opts {
		o(e)
	}
	if e.usage == nil {
		e.usage = NewUsage()
	}
	for i, k := range cfg.Clients.Keys {
		c := &Client{ID: k.ID, Plan: k.Plan, Index: i}
		e.clients = append(e.clients, c)
		e.keyring.Add(k.Digest, c)
	}
	for i, pc := range cfg.Policies {
		lim, ok := limiters[pc.Mode]
		if !ok || lim == nil {
			return nil, fmt.Errorf("policy %q: mode %s needs Redis, and this process started without a redis section (adding one takes a restart)", pc.Name, pc.Mode)
		}
		p := &Policy{
			Policy:          pc,
			Index:           i,
			limiter:         lim,
			prefix:          string(appendEscaped(nil, pc.Name)),
			decisionMetrics: m.forPolicy(pc.Name, string(pc.Mode)),
			top:             e.usage.tracker(pc.Name),
		}
		if pc.Cost.From != config.CostConstant {
			p.costReader = m.forCost(pc.Name)
		}
		if pc.PlanFrom.Kind != "" {
			p.unknownPlan = m.UnknownPlans.WithLabelValues(pc.Name)
		}
		if pc.Unlimited || (pc.UsePlan && anyUnlimited(cfg.Plans)) {
			p.unlimited = m.Decisions.WithLabelValues(pc.Name, string(pc.Mode), "unlimited")
		}
		cals := calendars{}
		switch {
		case pc.Unlimited:
			p.fixed = e.newUnlimited(pc)
		case pc.UsePlan:
			p.plans = make(map[string]Limit, len(cfg.Plans)+1)
			for _, name := range sortedPlans(cfg.Plans) {
				plan := cfg.Plans[name]
				l := e.newLimit(pc, plan.Limit, plan.Window, plan.Burst, cals.of(pc, plan.Period))
				if plan.Unlimited {
					l = e.newUnlimited(pc)
				}
				p.plans[name] = l
				if name == config.DefaultPlan {
					p.plans[""] = l
				}
			}
		default:
			p.fixed = e.newLimit(pc, pc.Limit, pc.Window, pc.Burst, cals.of(pc, pc.Period))
			if pc.LimitFrom.From != config.CostConstant {
				p.ceiling = e.newLimit(pc, pc.LimitFrom.Max, pc.Window, pc.Burst, cals.of(pc, pc.Period))
				p.limitReader = m.forLimit(pc.Name)
			}
		}
		e.policies = append(e.policies, p)
	}
	e.headers = requestHeaders(cfg, e.keyHeader, e.keyring.Len())
	e.all = e.policies
	if af := cfg.Clients.AuthFailures; af != nil {
		if err := e.compileAuthFailures(af, limiters, m); err != nil {
			return nil, err
		}
		e.all = append(e.policies[:len(e.policies):len(e.policies)], e.authFail)
	}
	e.usage.retain(e.policies)
	m.ConfigPolicies.Set(float64(len(e.policies)))
	return e, nil
}

// calendars holds a policy's calendars, one per period, so every limit of
// that period shares one cache of window bounds.
type calendars map[config.Period]*quota.Calendar

// of returns the calendar of period under p; nil unless p is a calendar
// policy.
func (c calendars) of(p config.Policy, period config.Period) *quota.Calendar {
	if !p.Calendar || period == "" {
		return nil
	}
	if cal, ok := c[period]; ok {
		return cal
	}
	cal := quota.NewCalendar(periods[period], p.TimeZone)
	c[period] = cal
	return cal
}

// newLimit compiles one limit of policy p and numbers it; cal aligns a
// calendar policy's windows.
func (e *Engine) newLimit(p config.Policy, n int64, window time.Duration, burst int64, cal *quota.Calendar) Limit {
	l := compileLimit(p, n, window, burst, cal)
	l.Index = e.limits
	e.limits++
	return l
}

// compileLimit translates one limit of policy p into quota terms and
// renders its RateLimit-Policy header.
func compileLimit(p config.Policy, n int64, window time.Duration, burst int64, cal *quota.Calendar) Limit {
	return Limit{
		Limit: quota.Limit{
			Algorithm: algorithms[p.Algorithm],
			Limit:     n,
			Window:    window,
			Burst:     burst,
			OnError:   onErrors[p.OnRedisError],
			Queue:     p.Queue,
			MaxDelay:  p.MaxDelay,
			Calendar:  cal,
			Overdraft: p.Charge == config.ChargeAlways,
			BlockFor:  blockFor(p),
		},
		Header: policyHeader(p.Name, n, window),
	}
}

// blockFor is p's penalty box: none for a shadow policy, whose denials
// are observed, never enforced.
func blockFor(p config.Policy) time.Duration {
	if p.Shadow {
		return 0
	}
	return p.BlockFor
}

// newUnlimited is the limit of an unlimited policy or plan of p, numbered
// like the others. It has no header: an unlimited decision is not
// described to clients.
func (e *Engine) newUnlimited(config.Policy) Limit {
	l := Limit{Limit: quota.Limit{Unlimited: true}, Index: e.limits}
	e.limits++
	return l
}

func anyUnlimited(plans map[string]config.Plan) bool {
	for _, p := range plans {
		if p.Unlimited {
			return true
		}
	}
	return false
}

// The configuration's names for the quota values, translated at compile
// time only.
var (
	algorithms = map[config.Algorithm]quota.Algorithm{
		config.TokenBucket:   quota.TokenBucket,
		config.SlidingWindow: quota.SlidingWindow,
		config.FixedWindow:   quota.FixedWindow,
		config.SlidingLog:    quota.SlidingLog,
		config.LeakyBucket:   quota.LeakyBucket,
	}
	periods = map[config.Period]quota.Period{
		config.PeriodDay:   quota.Day,
		config.PeriodWeek:  quota.Week,
		config.PeriodMonth: quota.Month,
		config.PeriodYear:  quota.Year,
	}
	onErrors = map[config.OnRedisError]quota.OnError{
		config.OnErrorFallback: quota.ErrorFallback,
		config.OnErrorAllow:    quota.ErrorAllow,
		config.OnErrorDeny:     quota.ErrorDeny,
	}
)

// Config returns the configuration the engine was compiled from.
func (e *Engine) Config() *config.Config { return e.cfg }

// Policies returns the compiled policies, in configuration order, then the
// limit on authentication failures when clients.auth_failures is set
// (named AuthFailuresPolicy); a door renders its per-policy values from
// them once per configuration.
func (e *Engine) Policies() []*Policy { return e.all }

// Clients returns the known API key holders, by Index.
func (e *Engine) Clients() []*Client { return e.clients }

// LimitCount is the number of Limits compiled, numbered by Limit.Index.
func (e *Engine) LimitCount() int { return e.limits }

// Limits returns every limit the policy may apply that has an Index: for
// a limit read per request, its default's and its max's (those between
// have Index -1).
func (p *Policy) Limits() []Limit {
	if p.limitReader != nil {
		return []Limit{p.fixed, p.ceiling}
	}
	if !p.UsePlan {
		return []Limit{p.fixed}
	}
	out := make([]Limit, 0, len(p.plans))
	for name, l := range p.plans {
		if name != "" {
			out = append(out, l)
		}
	}
	return out
}

// limitFor returns the limit that applies to request a from client c
// under p: the policy's own, or the plan named by plan_from, else by the
// client's API key, else plans.default. A plan_from name that is not a
// plan is counted and gets plans.default.
func (p *Policy) limitFor(a *Request, c *Client) Limit {
	if !p.UsePlan {
		return p.fixed
	}
	if p.PlanFrom.Kind != "" {
		var name string
		if p.PlanFrom.Kind == config.KeyHeader {
			name = a.Headers[p.PlanFrom.Name]
		} else {
			name, _ = a.claim(p.PlanFrom.Name)
		}
		if name != "" {
			if l, ok := p.plans[name]; ok {
				return l
			}
			p.unknownPlan.Inc()
			return p.plans[""]
		}
	}
	if c != nil && c.Plan != "" {
		if l, ok := p.plans[c.Plan]; ok {
			return l
		}
	}
	return p.plans[""]
}
