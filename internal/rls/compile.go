package rls

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/engine"
	"github.com/extauthz/extauthz/internal/rlsconfig"
)

// compiled is one configuration: the main one (for the mode of limits
// Envoy sends and the response settings) and the descriptor trees of its
// domains, every rate limit compiled into an engine.Policy.
type compiled struct {
	cfg     *config.Config
	rls     *rlsconfig.Config
	domains map[string]*domain
	// names holds the policies of the metric names made per request
	// (detailed_metric, value_to_metric) and of the limits Envoy sends,
	// within the process's budget of each kind (Server.budgets).
	names, overrides bounded

	metrics  *engine.Metrics
	limiters engine.Limiters
	log      *slog.Logger

	warnedUnknown atomic.Bool // an unknown domain was logged
}

// domain is one domain's descriptor tree.
type domain struct {
	name string
	root level
}

// level is one descriptor list, indexed for lookup.
type level struct {
	exact map[entry]*node  // by key and value (a wildcard value too, literally)
	any   map[string]*node // descriptors without a value, by key
	wild  []wildNode       // descriptors with a wildcard value, in configuration order
}

type entry struct{ key, value string }

type wildNode struct {
	key   string
	parts []string // the value split at its '*'s
	node  *node
}

// node is one descriptor.
type node struct {
	level
	d    *rlsconfig.Descriptor
	rule *rule // nil: no rate limit at this level
}

// rule is one descriptor's compiled rate limits.
type rule struct {
	stat      string // its metric name, as envoyproxy/ratelimit names its stats: domain.key_value.key
	unlimited bool
	// dynamic: the decisions' metric name is made from the request's
	// values (detailed_metric here, or value_to_metric on its path).
	dynamic  bool
	detailed bool
	// shared: a wildcard with share_threshold on its path, whose
	// matched values count together.
	shared bool
	// limits are the descriptor's rate limits in file order, every one
	// of which must allow a request: one, with no policy, when unlimited.
	limits []limit
}

// limit is one rate limit of a descriptor.
type limit struct {
	name     string // the rate_limit's name: what replaces refers to
	replaces []string
	// suffix tells apart, in partition keys and metric names, the limits
	// of a descriptor with several: "" for a descriptor's only limit,
	// which keeps the key and name it has always had.
	suffix  limitSuffix
	policy  *engine.Policy // nil when unlimited
	current *rlsv3.RateLimitResponse_RateLimit
	// keyed: the rate limit counts in a policy's bucket (rate_limit.policy),
	// its key the policy's with the request's entries as the key parts.
	keyed bool
	// How a denial of this limit is answered, as envoyproxy/ratelimit
	// answers it. Each of these compiles the policy in shadow (decide
	// and count, never deny the request): quota, the descriptor's
	// quota_mode or the global rls.quota_mode, whose status is OK and
	// which the dynamic metadata lists among the violations; ownShadow,
	// the descriptor's shadow_mode, whose status is OK; and the global
	// rls.shadow_mode, whose status stays OVER_LIMIT under an overall OK.
	quota, ownShadow bool
	// quotaMode is the descriptor's own quota_mode (not the global
	// one): the dynamic metadata's quotaModeEnabled.
	quotaMode bool
}

// limitSuffix is what a limit of a descriptor with several adds, by its
// window (a descriptor has one limit per window, so a reordered or
// lengthened list keeps each limit's count): to the partition key,
// "%w30s", which no escaped value holds (a '%' there is followed by two
// hex digits, or by the digest's "sha256."), so no request's values can
// name another limit's key; to the metric and RateLimit header name,
// "/30s".
type limitSuffix struct{ key, name string }

func suffixOf(w time.Duration) limitSuffix {
	label := rlsconfig.FormatWindow(w)
	return limitSuffix{key: "%w" + label, name: "/" + label}
}

// maxNames bounds the metric names the process makes from request values,
// of each kind: each is a set of Prometheus series, kept for the life of
// the process whichever configuration made it, so the bound is the
// process's, not a configuration's (a reload storm made 4,001 names when
// each configuration had its own). Past the bound, decisions count under
// the rate limit's own name (or the domain's, for limits Envoy sends).
const maxNames = 1000

// budgets are the process's name budgets, one per kind, shared by every
// configuration a Server compiles.
type budgets struct{ names, overrides nameBudget }

// nameBudget is the set of metric names made from request values so far:
// at most maxNames. Safe for concurrent use.
type nameBudget struct {
	mu   sync.Mutex
	made map[string]struct{}
}

// admit reports whether name may count under a name of its own: it
// already does, or fewer than maxNames names do (name then does).
func (b *nameBudget) admit(name string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.made[name]; ok {
		return true
	}
	if len(b.made) >= maxNames {
		return false
	}
	if b.made == nil {
		b.made = map[string]struct{}{}
	}
	b.made[name] = struct{}{}
	return true
}

func compile(cfg *config.Config, rc *rlsconfig.Config, limiters engine.Limiters, m *engine.Metrics, log *slog.Logger, bs *budgets) (*compiled, error) {
	c := &compiled{cfg: cfg, rls: rc, domains: map[string]*domain{}, metrics: m, limiters: limiters, log: log}
	c.names.init("metric names made from request values (detailed_metric, value_to_metric)", &bs.names)
	c.overrides.init("rate limits sent with requests", &bs.overrides)
	if rc == nil {
		return c, nil
	}
	for name, d := range rc.Domains {
		dom := &domain{name: name}
		if err := c.level(&dom.root, d.Descriptors, name, d, false, false); err != nil {
			return nil, err
		}
		c.domains[name] = dom
	}
	return c, nil
}

// level compiles a descriptor list of domain dom: stat is its parent's
// metric name, valueToMetric and shared whether a parent had
// value_to_metric or share_threshold.
func (c *compiled) level(lv *level, ds []*rlsconfig.Descriptor, stat string, dom *rlsconfig.Domain, valueToMetric, shared bool) error {
	lv.exact, lv.any = map[entry]*node{}, map[string]*node{}
	for _, d := range ds {
		n := &node{d: d}
		// envoyproxy/ratelimit names a descriptor key_value, or key alone.
		own := stat + "." + d.Key
		if d.Value != "" {
			own += "_" + d.Value
		}
		vtm := valueToMetric || d.ValueToMetric
		sh := shared || d.ShareThreshold
		if len(d.Limits) > 0 {
			r, err := c.rule(d, own, dom, vtm)
			if err != nil {
				return err
			}
			r.shared = sh
			n.rule = r
		}
		switch {
		case d.Value == "":
			lv.any[d.Key] = n
		default:
			lv.exact[entry{d.Key, d.Value}] = n
			if d.Wildcard != nil {
				lv.wild = append(lv.wild, wildNode{key: d.Key, parts: d.Wildcard, node: n})
			}
		}
		if err := c.level(&n.level, d.Descriptors, own, dom, vtm, sh); err != nil {
			return err
		}
	}
	return nil
}

func (c *compiled) rule(d *rlsconfig.Descriptor, stat string, dom *rlsconfig.Domain, valueToMetric bool) (*rule, error) {
	r := &rule{
		stat:      stat,
		unlimited: d.Limits[0].Unlimited,
		detailed:  d.DetailedMetric,
		dynamic:   d.DetailedMetric || valueToMetric,
		limits:    make([]limit, len(d.Limits)),
	}
	for i, l := range d.Limits {
		lim := &r.limits[i]
		lim.name, lim.replaces = l.Name, l.Replaces
		lim.ownShadow, lim.quotaMode = d.Shadow, d.Quota
		lim.quota = !d.Shadow && (d.Quota || c.cfg.RLS.QuotaMode)
		if l.Unlimited {
			continue // alone in its descriptor (rlsconfig)
		}
		path := d.Path + ".rate_limit"
		if len(d.Limits) > 1 {
			lim.suffix = suffixOf(l.Window)
			path = fmt.Sprintf("%s.rate_limits[%d]", d.Path, i)
		}
		if l.Policy != "" {
			if err := c.sharedLimit(lim, l, d, stat, dom, path); err != nil {
				return nil, err
			}
			continue
		}
		lim.current = &rlsv3.RateLimitResponse_RateLimit{Name: l.Name, RequestsPerUnit: uint32(l.RequestsPerUnit), Unit: units[l.Unit]}
		if l.UnitMultiplier > 1 {
			lim.current.UnitMultiplier = wrapperspb.UInt32(uint32(l.UnitMultiplier))
		}
		p, err := c.policy(config.Policy{
			Name:         stat + lim.suffix.name,
			Limit:        l.RequestsPerUnit,
			Window:       l.Window,
			Burst:        l.Burst,
			Algorithm:    l.Algorithm,
			Mode:         l.Mode,
			OnRedisError: l.OnRedisError,
			BlockFor:     l.BlockFor,
			Charge:       l.Charge,

			Shadow:   c.softly(d),
			Queue:    l.Queue,
			MaxDelay: l.MaxDelay,
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", dom.File, path, err)
		}
		lim.policy = p
	}
	return r, nil
}

// sharedRule compiles a rate limit that counts in the bucket of the main
// configuration's policy l.Policy (rlsconfig checked that it may): the
// policy compiled for this door with the limiters Check's decide with,
// so both doors reach one count under one key; its decisions count under
// the descriptor's metric name.
func (c *compiled) sharedLimit(lim *limit, l *rlsconfig.RateLimit, d *rlsconfig.Descriptor, stat string, dom *rlsconfig.Domain, path string) error {
	var pc *config.Policy
	for i := range c.cfg.Policies {
		if c.cfg.Policies[i].Name == l.Policy {
			pc = &c.cfg.Policies[i]
		}
	}
	if pc == nil {
		return fmt.Errorf("%s: %s.policy: %q is not a policy of the main configuration", dom.File, path, l.Policy)
	}
	shared := *pc
	shared.Shadow = pc.Shadow || c.softly(d)
	p, err := engine.NewPolicy(shared, c.limiters, c.metrics)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", dom.File, path, err)
	}
	unit, perUnit := statusUnit(pc.Window, pc.Limit)
	lim.current = &rlsv3.RateLimitResponse_RateLimit{Name: l.Name, RequestsPerUnit: perUnit, Unit: unit}
	lim.policy, lim.keyed = p.CountedAs(stat+lim.suffix.name, c.metrics), true
	return nil
}

// softly reports whether d's limits decide and count without denying a
// request: shadow_mode or quota_mode, its own or the configuration's.
func (c *compiled) softly(d *rlsconfig.Descriptor) bool {
	return d.Shadow || d.Quota || c.cfg.RLS.ShadowMode || c.cfg.RLS.QuotaMode
}

// statusUnit describes a policy's limit in the protocol's terms, which
// know only whole units: its window when it is one, else the limit
// spread over seconds (rounded down, at least 1).
func statusUnit(window time.Duration, n int64) (rlsv3.RateLimitResponse_RateLimit_Unit, uint32) {
	for name, w := range rlsconfig.Units {
		if w == window {
			return units[name], uint32(min(n, rlsconfig.MaxRequestsPerUnit))
		}
	}
	return rlsv3.RateLimitResponse_RateLimit_SECOND, uint32(max(min(int64(float64(n)/window.Seconds()), rlsconfig.MaxRequestsPerUnit), 1))
}

// policy compiles a rate limit; one of 0 requests per unit puts every
// request over the limit without counting.
func (c *compiled) policy(p config.Policy) (*engine.Policy, error) {
	limiters := c.limiters
	if p.Limit == 0 {
		limiters = engine.Limiters{p.Mode: blocked{}}
	}
	return engine.NewPolicy(p, limiters, c.metrics)
}

// units maps the configuration's unit names to the protocol's.
var units = map[string]rlsv3.RateLimitResponse_RateLimit_Unit{
	"second": rlsv3.RateLimitResponse_RateLimit_SECOND,
	"minute": rlsv3.RateLimitResponse_RateLimit_MINUTE,
	"hour":   rlsv3.RateLimitResponse_RateLimit_HOUR,
	"day":    rlsv3.RateLimitResponse_RateLimit_DAY,
	"week":   rlsv3.RateLimitResponse_RateLimit_WEEK,
	"month":  rlsv3.RateLimitResponse_RateLimit_MONTH,
	"year":   rlsv3.RateLimitResponse_RateLimit_YEAR,
}

// bounded is one configuration's set of policies made on demand: under
// names of their own while the process's budget admits them, then one
// under a fallback name (the configuration's, not the request's) each.
type bounded struct {
	what   string // for the warning when full
	budget *nameBudget
	mu     sync.Mutex
	m      map[string]*engine.Policy
	warned bool
}

func (b *bounded) init(what string, budget *nameBudget) {
	b.what, b.budget, b.m = what, budget, map[string]*engine.Policy{}
}

// get returns the policy made for key, making it with mk(key) while the
// budget admits key; past that, the one made for fallback. It logs the
// first refusal.
func (b *bounded) get(key, fallback string, mk func(key string) (*engine.Policy, error), log *slog.Logger) (*engine.Policy, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p, ok := b.m[key]; ok {
		return p, nil
	}
	if key != fallback && !b.budget.admit(key) {
		if !b.warned && log != nil {
			b.warned = true
			log.Warn("rls: too many "+b.what+"; further ones count under their rate limit's or domain's name (logged once per configuration)", "max", maxNames)
		}
		if p, ok := b.m[fallback]; ok {
			return p, nil
		}
		key = fallback
	}
	p, err := mk(key)
	if err != nil {
		return nil, err
	}
	b.m[key] = p
	return p, nil
}
