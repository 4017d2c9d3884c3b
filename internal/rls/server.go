// Package rls is the door of Envoy's rate limit service protocol,
// envoy.service.ratelimit.v3.RateLimitService, which Envoy's ratelimit
// HTTP and network filters, Istio's global rate limiting and Envoy
// Gateway call. It reads envoyproxy/ratelimit's descriptor configuration
// (internal/rlsconfig) and decides through the same engine as the
// ext_authz door: every descriptor's rate limit is an engine.Policy with
// the process's limiters (local, redis, hybrid, the fallback and the
// breaker), and a request's descriptors are taken all or nothing by
// engine.TakeAll. A request of several descriptors one of which is over
// its limit spends nothing from the others; under rls.counting: each (the
// default in the anchor's environment, internal/rlsenv) they are counted
// as envoyproxy/ratelimit counts them instead (engine.TakeEach): each on
// its own, the one over its limit included.
//
// The matching rules are envoyproxy/ratelimit's (match.go); the answer
// carries the status of every descriptor, and the RateLimit headers and
// the problem body every door sends.
package rls

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/extauthz/extauthz/internal/anchorstats"
	"github.com/extauthz/extauthz/internal/check"
	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/engine"
	"github.com/extauthz/extauthz/internal/rlsconfig"
)

// Door is this door's name in the metrics: extauthz_checks_total{door="rls"}.
const Door = "rls"

// MaxDescriptors is the most descriptors one request may carry: each is a
// quota decision (in redis mode, a Redis round trip), as a Check's
// policies are, under the same bound. Envoy sends one per rate limit
// configuration that applies to a route, so more is a configuration to fix.
const MaxDescriptors = engine.MaxPoliciesPerRequest

// Server is the rate limit service. It is safe for concurrent use; Update
// swaps the configuration without blocking calls in flight.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer

	limiters engine.Limiters
	metrics  *engine.Metrics
	door     *engine.DoorMetrics
	own      *Metrics
	now      func() time.Time
	hold     engine.HoldFunc
	log      *slog.Logger
	current  atomic.Pointer[compiled]
	budgets  budgets            // metric names made from requests, across configurations
	anchor   *anchorstats.Stats // nil: envoyproxy/ratelimit's stats are not counted
	// deferred holds the denied hits rls.counting: each charges in
	// redis and hybrid mode, summed per key; a reload charges what it
	// holds.
	deferred *engine.DeferredCharges
}

// Option configures a Server.
type Option func(*Server)

// WithClock sets the source of decision instants (by default the instant
// the call arrived). Each call reads it once.
func WithClock(now func() time.Time) Option { return func(s *Server) { s.now = now } }

// WithHold replaces how an admitted request is held until its leaky
// bucket slot (a timer by default). Tests pass a recorder.
func WithHold(hold engine.HoldFunc) Option { return func(s *Server) { s.hold = hold } }

// WithLog receives the warnings of a configuration (an unknown domain, too
// many metric names), each once per configuration.
func WithLog(log *slog.Logger) Option { return func(s *Server) { s.log = log } }

// WithMetrics counts this door's own events in m (by default in
// collectors registered nowhere).
func WithMetrics(m *Metrics) Option { return func(s *Server) { s.own = m } }

// New returns a Server enforcing the domains of rc (nil: none, every
// request is allowed) under running's configuration, taking with its
// limiters and counting in its metrics, as the process's other doors do.
// The descriptors are this door's own: a reload prepares them beside the
// Running's (Prepare).
func New(running *engine.Running, rc *rlsconfig.Config, opts ...Option) (*Server, error) {
	m := running.Metrics()
	s := &Server{limiters: running.Limiters(), metrics: m, door: m.Door(Door), own: NewMetrics(nil),
		deferred: engine.NewDeferredCharges(0)}
	for _, o := range opts {
		o(s)
	}
	if err := s.Update(running.Config(), rc); err != nil {
		return nil, err
	}
	return s, nil
}

// Update compiles the configuration and makes it the running one. On error
// the running configuration stays.
func (s *Server) Update(cfg *config.Config, rc *rlsconfig.Config) error {
	commit, err := s.Prepare(cfg, rc)
	if err != nil {
		return err
	}
	commit()
	return nil
}

// Prepare compiles the configuration; commit makes it the running one. A
// reload prepares every door before committing any, so the doors change
// configuration together or not at all.
func (s *Server) Prepare(cfg *config.Config, rc *rlsconfig.Config) (commit func(), err error) {
	c, err := compile(cfg, rc, s.limiters, s.metrics, s.log, &s.budgets)
	if err != nil {
		return nil, err
	}
	return func() {
		// The denied hits held (redis and hybrid mode) are charged
		// before the new limits decide (a raised limit sees them), and again after
		// for those denied meanwhile.
		ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
		defer cancel()
		s.deferred.Flush(ctx, s.instant())
		s.current.Store(c)
		s.deferred.Flush(ctx, s.instant())
	}, nil
}

// instant is the decision instant now: the clock WithClock set, or the
// time.
func (s *Server) instant() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

// flushTimeout bounds the charges a reload makes of held denied hits.
const flushTimeout = 2 * time.Second

// Config returns the running descriptor configuration (nil: none).
func (s *Server) Config() *rlsconfig.Config { return s.current.Load().rls }

// ShouldRateLimit implements envoy.service.ratelimit.v3.RateLimitService.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	now := start
	if s.now != nil {
		now = s.now()
	}
	c := s.current.Load()
	if check.UndecodableRateLimitRequest(req) {
		resp := undecodableOverLimit
		if c.cfg.RLS.OnUndecodable == config.UndecodableAllow {
			resp = undecodableOK
		}
		s.own.Undecodable.WithLabelValues(undecodableAnswer[resp.GetOverallCode()]).Inc()
		s.door.Observe(engine.Failed, time.Since(start).Seconds())
		return resp, nil
	}
	a := answers.Get().(*answer)
	resp, outcome, err := s.decide(ctx, c, req, now, a)
	if s.anchor != nil && err == nil {
		s.countAnchor(a, outcome)
	}
	a.reset()
	answers.Put(a)
	s.door.Observe(outcome, time.Since(start).Seconds())
	return resp, err
}

// answers recycles the working state of calls: a call's takes and slots
// are not needed once its response is built (which shares none of them),
// and at a few hundred bytes each they were most of a call's garbage.
var answers = sync.Pool{New: func() any { return new(answer) }}

// answer is one request's decisions: a take per rate limit that counts
// (a descriptor of several limits has several), and what each descriptor
// found.
type answer struct {
	takes   []engine.Taken
	limits  []*limit // by take: the rate limit it counts for; nil for a limit Envoy sent
	asked   int      // takes[:asked] were decided; TakeAll stops at a denial
	each    bool     // counted by engine.TakeEach (rls.counting: each...): nothing refunded
	slots   []slot   // by descriptor
	takeBuf [2]engine.Taken
	limBuf  [2]*limit
	slotBuf [2]slot
}

// reset clears a for reuse, dropping the pointers it held.
func (a *answer) reset() { *a = answer{} }

// slot is what one descriptor found.
type slot struct {
	rule    *rule                              // nil: no rate limit (or a limit Envoy sent)
	stat    string                             // envoyproxy/ratelimit's stat key, when its stats are counted
	current *rlsv3.RateLimitResponse_RateLimit // a limit Envoy sent, for the status
	// takes[take:take+n] are the descriptor's rate limits, in order;
	// n is 0 when nothing counts.
	take, n int
}

// open starts the slot of a descriptor whose takes follow (add).
func (a *answer) open(r *rule, cur *rlsv3.RateLimitResponse_RateLimit) {
	a.slots = append(a.slots, slot{rule: r, current: cur, take: len(a.takes)})
}

// add appends a take of the last slot's descriptor, for rate limit l.
func (a *answer) add(l *limit, t engine.Taken) {
	a.slots[len(a.slots)-1].n++
	a.takes = append(a.takes, t)
	a.limits = append(a.limits, l)
}

// drop removes the takes of rate limits whose name is replaced.
func (a *answer) drop(replaced map[string]bool) {
	kept, keptLimits := a.takes[:0], a.limits[:0]
	for i := range a.slots {
		sl := &a.slots[i]
		from, n := sl.take, sl.n
		sl.take, sl.n = len(kept), 0
		for j := from; j < from+n; j++ {
			if l := a.limits[j]; l != nil && l.name != "" && replaced[l.name] {
				continue
			}
			kept, keptLimits = append(kept, a.takes[j]), append(keptLimits, a.limits[j])
			sl.n++
		}
	}
	a.takes, a.limits = kept, keptLimits
}

func (s *Server) decide(ctx context.Context, c *compiled, req *rlsv3.RateLimitRequest, now time.Time, a *answer) (*rlsv3.RateLimitResponse, engine.Outcome, error) {
	ds := req.GetDescriptors()
	switch {
	case req.GetDomain() == "":
		return nil, engine.Failed, grpcstatus.Error(codes.InvalidArgument, "rls: the request names no domain")
	case len(ds) == 0:
		return nil, engine.Failed, grpcstatus.Error(codes.InvalidArgument, "rls: the request carries no descriptor")
	case len(ds) > MaxDescriptors:
		return nil, engine.Failed, grpcstatus.Errorf(codes.InvalidArgument,
			"rls: the request carries %d descriptors; at most %d (each is a rate limit decision): fix the route's rate_limits", len(ds), MaxDescriptors)
	}
	for i, d := range ds {
		if n := len(d.GetEntries()); n > maxEntries {
			return nil, engine.Failed, grpcstatus.Errorf(codes.InvalidArgument,
				"rls: descriptors[%d] has %d entries; at most %d (no configured descriptor nests deeper)", i, n, maxEntries)
		}
	}
	dom := c.domains[req.GetDomain()]
	if dom == nil {
		s.own.UnknownDomains.Inc()
		if s.log != nil && c.warnedUnknown.CompareAndSwap(false, true) {
			s.log.Warn("rls: a request names a domain no file defines; its descriptors are not limited (logged once per configuration)",
				"domain", req.GetDomain(), "domains", len(c.domains))
		}
		resp := noLimits(len(ds))
		if c.cfg.RLS.DynamicMetadata {
			// As the anchor: its metadata on every answer, no limit matched.
			resp.DynamicMetadata = dynamicMetadata(req, nil, &answer{})
		}
		return resp, engine.OK, nil
	}

	// 1. Each descriptor's rate limit, its partition key and metric name,
	// all before any quota is taken; and the names the limits found
	// replace.
	a.takes, a.limits, a.slots = a.takeBuf[:0], a.limBuf[:0], a.slotBuf[:0]
	var steps [maxEntries]step
	var replaced map[string]bool
	for i, d := range ds {
		entries := d.GetEntries()
		if o := d.GetLimit(); o != nil {
			cur, window, err := overrideLimit(i, o)
			if err != nil {
				return nil, engine.Failed, err
			}
			p, err := c.overridePolicy(dom.name, entries, int64(cur.GetRequestsPerUnit()), window)
			if err != nil {
				return nil, engine.Failed, grpcstatus.Errorf(codes.Internal, "rls: %v", err)
			}
			a.open(nil, cur)
			if s.anchor != nil {
				a.slots[len(a.slots)-1].stat = anchorOverrideKey(dom.name, entries)
			}
			a.add(nil, engine.Taken{Policy: p, Key: partition(dom.name, entries, nil),
				Limit: p.NewLimit(int64(cur.GetRequestsPerUnit()), window), Units: hits(req, d)})
			continue
		}
		r := dom.match(entries, steps[:])
		a.open(r, nil)
		if r == nil {
			continue
		}
		for i := range r.limits {
			for _, name := range r.limits[i].replaces {
				if replaced == nil {
					replaced = map[string]bool{}
				}
				replaced[name] = true
			}
		}
		if r.unlimited {
			continue
		}
		matched := steps[:len(entries)]
		if s.anchor != nil {
			a.slots[len(a.slots)-1].stat = r.stat
			if r.dynamic {
				a.slots[len(a.slots)-1].stat = anchorStatKey(dom.name, r, entries, matched)
			}
		}
		var metric string
		if r.dynamic {
			metric = metricName(dom.name, r, entries, matched)
		}
		if !r.shared {
			matched = nil // the key holds the request's values as they are
		}
		key := partition(dom.name, entries, matched)
		for i := range r.limits {
			l := &r.limits[i]
			p := l.policy
			if r.dynamic {
				var err error
				p, err = c.names.get(metric+l.suffix.name, p.Name, func(name string) (*engine.Policy, error) {
					if name == l.policy.Name {
						return l.policy, nil
					}
					return l.policy.CountedAs(name, c.metrics), nil
				}, s.log)
				if err != nil {
					return nil, engine.Failed, grpcstatus.Errorf(codes.Internal, "rls: %v", err)
				}
			}
			k := key + l.suffix.key
			if l.keyed {
				k = sharedPartition(p, entries) // the policy's own key: one bucket for both doors
			}
			a.add(l, engine.Taken{Policy: p, Key: k, Limit: p.FixedLimit(), Units: hits(req, d)})
		}
	}
	if replaced != nil {
		a.drop(replaced)
	}

	// 2. Take them all or none (the default), or each as
	// envoyproxy/ratelimit counts them (rls.counting).
	var outcome engine.Outcome
	var asked int
	var err error
	switch c.cfg.RLS.Counting {
	case config.CountingEach, config.CountingEachStopWhenOver:
		a.each = true
		outcome, asked, err = engine.TakeEach(ctx, a.takes, now, s.hold, engine.EachOptions{StopOver: c.cfg.RLS.Counting == config.CountingEachStopWhenOver, Deferred: s.deferred})
	default:
		outcome, asked, err = engine.TakeAll(ctx, a.takes, now, s.hold)
	}
	a.asked = asked
	if err != nil {
		return nil, outcome, check.DecisionError(err, outcome, "rls: ")
	}
	return c.respond(req, a, outcome, now), outcome, nil
}

// hits is the units a descriptor spends: its own hits_addend when Envoy
// set one (0 asks without spending), else the request's, where 0 (unset)
// means 1. envoyproxy/ratelimit reads them the same way.
func hits(req *rlsv3.RateLimitRequest, d *ratelimitv3.RateLimitDescriptor) int64 {
	if h := d.GetHitsAddend(); h != nil {
		return int64(min(h.GetValue(), maxHits))
	}
	return int64(max(req.GetHitsAddend(), 1))
}

// maxHits bounds a descriptor's hits: more than any limit holds is denied
// all the same, and counts stay far from overflowing.
const maxHits = 1 << 40

// overrideLimit reads the limit Envoy sent with descriptor i: the status's
// current_limit, and the window (the unit times its multiplier).
func overrideLimit(i int, o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) (*rlsv3.RateLimitResponse_RateLimit, time.Duration, error) {
	u, ok := overrideUnits[o.GetUnit()]
	if !ok {
		return nil, 0, grpcstatus.Errorf(codes.InvalidArgument, "rls: descriptors[%d].limit.unit: %s is not a unit", i, o.GetUnit())
	}
	cur := &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: o.GetRequestsPerUnit(), Unit: u.unit}
	mult := int64(1)
	if m := o.GetUnitMultiplier(); m != nil && m.GetValue() > 1 {
		mult = int64(m.GetValue())
		cur.UnitMultiplier = m
	}
	if mult > int64(maxOverrideWindow/u.length) {
		return nil, 0, grpcstatus.Errorf(codes.InvalidArgument, "rls: descriptors[%d].limit: %d × %s is longer than %s", i, mult, o.GetUnit(), maxOverrideWindow)
	}
	return cur, time.Duration(mult) * u.length, nil
}

// maxOverrideWindow is the longest window a limit Envoy sends may have.
const maxOverrideWindow = 366 * 24 * time.Hour

// overrideUnits are the units of a limit Envoy sends (envoy.type.v3 has
// no week).
var overrideUnits = map[typev3.RateLimitUnit]struct {
	unit   rlsv3.RateLimitResponse_RateLimit_Unit
	length time.Duration
}{
	typev3.RateLimitUnit_SECOND: {rlsv3.RateLimitResponse_RateLimit_SECOND, rlsconfig.Units["second"]},
	typev3.RateLimitUnit_MINUTE: {rlsv3.RateLimitResponse_RateLimit_MINUTE, rlsconfig.Units["minute"]},
	typev3.RateLimitUnit_HOUR:   {rlsv3.RateLimitResponse_RateLimit_HOUR, rlsconfig.Units["hour"]},
	typev3.RateLimitUnit_DAY:    {rlsv3.RateLimitResponse_RateLimit_DAY, rlsconfig.Units["day"]},
	typev3.RateLimitUnit_MONTH:  {rlsv3.RateLimitResponse_RateLimit_MONTH, rlsconfig.Units["month"]},
	typev3.RateLimitUnit_YEAR:   {rlsv3.RateLimitResponse_RateLimit_YEAR, rlsconfig.Units["year"]},
}

// overridePolicy is the policy of a limit Envoy sent: a fixed window in
// the main configuration's default mode, never in shadow mode, replacing
// nothing, as envoyproxy/ratelimit treats it. Its decisions count under
// the domain and the entries' keys (the values would make a series per
// value); past maxNames such names, under the domain's.
func (c *compiled) overridePolicy(domain string, entries []*ratelimitv3.RateLimitDescriptor_Entry, n int64, window time.Duration) (*engine.Policy, error) {
	name, fallback := overrideName(domain, entries), domain
	if n == 0 { // blocking: a policy with a limiter of its own, counting nothing
		name, fallback = name+blockedSuffix, fallback+blockedSuffix
	}
	return c.overrides.get(name, fallback, func(key string) (*engine.Policy, error) {
		return c.policy(config.Policy{Name: strings.TrimSuffix(key, blockedSuffix), Limit: n, Window: window,
			Algorithm: config.FixedWindow, Mode: c.cfg.DefaultMode, OnRedisError: config.OnErrorFallback,
			Shadow: c.cfg.RLS.ShadowMode || c.cfg.RLS.QuotaMode})
	}, c.log)
}

// blockedSuffix tells apart, among the policies of limits Envoy sends, the
// blocking ones (0 requests per unit).
const blockedSuffix = "\x00blocked"
