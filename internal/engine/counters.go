package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/topkeys"
)

// The counters API's view of the engine: a key's count under a policy,
// read without spending it or reset, and each policy's keys by recent
// use. None of it runs in a decision but the recording of use.

// Top keys are tracked per policy in a summary of trackedKeys keys whose
// counts halve every usageHalfLife (see internal/topkeys); TopCounters
// lists at most MaxTop of them.
const (
	trackedKeys   = 1024
	usageHalfLife = time.Minute
	MaxTop        = 100
	maxCounterKey = 4096
)

// Usage is every policy's recent key use, kept across reloads (each
// compiles a new Engine) by policy name. It is safe for concurrent use.
type Usage struct {
	mu       sync.Mutex
	byPolicy map[string]*topkeys.Tracker
}

// NewUsage returns an empty record of key use.
func NewUsage() *Usage { return &Usage{byPolicy: map[string]*topkeys.Tracker{}} }

// WithUsage records key use in u, so that it outlives a reload. Without
// it an engine keeps a record of its own.
func WithUsage(u *Usage) Option { return func(e *Engine) { e.usage = u } }

// tracker returns the named policy's tracker, creating it.
func (u *Usage) tracker(name string) *topkeys.Tracker {
	u.mu.Lock()
	defer u.mu.Unlock()
	t, ok := u.byPolicy[name]
	if !ok {
		t = topkeys.New(trackedKeys, usageHalfLife)
		u.byPolicy[name] = t
	}
	return t
}

// retain drops the trackers of policies not in ps: a policy removed by a
// reload takes its record with it, so the record stays bounded by the
// configuration.
func (u *Usage) retain(ps []*Policy) {
	u.mu.Lock()
	defer u.mu.Unlock()
	keep := make(map[string]*topkeys.Tracker, len(ps))
	for _, p := range ps {
		keep[p.Name] = p.top
	}
	u.byPolicy = keep
}

// Errors of the counters API's requests.
var (
	ErrNoPolicy   = errors.New("no such policy")
	ErrBadKey     = errors.New("invalid key")
	ErrNoPlan     = errors.New("no such plan")
	ErrNotCounted = errors.New("this mode's counts cannot be read")
)

// Counter is what the counters API reports of one key under a policy.
type Counter struct {
	Policy    string
	Key       string // the partition key after the policy's name, as Top lists it: "client:ada"
	Mode      config.Mode
	Algorithm config.Algorithm
	Plan      string        // for limit: plan, the plan whose limit applies
	Limit     int64         // units per window; 0 when unlimited
	Window    time.Duration // nominal, for calendar windows
	Unlimited bool
	// Inspection is the count, as its limiter reports it; zero when
	// unlimited (no count is kept).
	Inspection quota.Inspection
	// Rate is the key's recent use on this replica, in requests per
	// second (1-minute half-life); 0 when it is not among the tracked.
	Rate float64
	// Err, in a TopCounters entry, says why its count could not be read
	// (Redis unreachable); Inspection is then zero.
	Err error
}

// policy returns the named policy.
func (e *Engine) policy(name string) (*Policy, error) {
	for _, p := range e.policies {
		if p.Name == name {
			return p, nil
		}
	}
	return nil, fmt.Errorf("%w %q", ErrNoPolicy, name)
}

// partitionOf returns the partition key of key under p: what Top lists,
// after the policy's name. A policy without key parts has one partition,
// key "".
func (p *Policy) partitionOf(key string) (string, error) {
	if key == "" {
		if len(p.Key) > 0 {
			return "", fmt.Errorf("%w: policy %s counts per %s; give the key as listed by top, such as %q", ErrBadKey, p.Name, describeKey(p), exampleKey(p))
		}
		return p.prefix, nil
	}
	if len(p.Key) == 0 {
		return "", fmt.Errorf("%w: policy %s keeps one count for every request; give no key", ErrBadKey, p.Name)
	}
	if len(key) > maxCounterKey || strings.ContainsFunc(key, func(r rune) bool { return r <= ' ' || r >= 0x7f || r == '{' || r == '}' }) {
		return "", fmt.Errorf("%w: keys are printable ASCII without spaces or braces, as top lists them (escaped), at most %d bytes", ErrBadKey, maxCounterKey)
	}
	return p.prefix + ":" + key, nil
}

func describeKey(p *Policy) string {
	parts := make([]string, len(p.Key))
	for i, k := range p.Key {
		parts[i] = k.String()
	}
	return strings.Join(parts, "+")
}

func exampleKey(p *Policy) string {
	parts := make([]string, len(p.Key))
	for i, k := range p.Key {
		parts[i] = k.String() + ":VALUE"
	}
	return strings.Join(parts, ":")
}

// limitNamed returns the limit of plan under p ("" when not a plan
// policy), or of the limit numbered index when plan is "" and index ≥ 0,
// else plans.default. For a limit read per request, index is the limit
// the key's last request had (usageAux), else ≤ 0: the default.
func (p *Policy) limitNamed(plan string, index int32) (Limit, string, error) {
	if p.limitReader != nil {
		if index < 1 {
			return p.fixed, "", nil
		}
		return p.limitOfValue(min(int64(index), p.LimitFrom.Max)), "", nil
	}
	if !p.UsePlan {
		return p.fixed, "", nil
	}
	if plan != "" {
		l, ok := p.plans[plan]
		if !ok {
			return Limit{}, "", fmt.Errorf("%w %q for policy %s", ErrNoPlan, plan, p.Name)
		}
		return l, plan, nil
	}
	for _, name := range slices.Sorted(maps.Keys(p.plans)) {
		if l := p.plans[name]; name != "" && index >= 0 && l.Index == int(index) {
			return l, name, nil
		}
	}
	return p.plans[""], config.DefaultPlan, nil
}

// Counter reads key's count under the named policy at now without
// spending it. For limit: plan, plan names the plan whose limit to apply;
// "" takes the one the key's last request had, if it is tracked, else
// plans.default.
func (e *Engine) Counter(ctx context.Context, policy, key, plan string, now time.Time) (Counter, error) {
	p, err := e.policy(policy)
	if err != nil {
		return Counter{}, err
	}
	partition, err := p.partitionOf(key)
	if err != nil {
		return Counter{}, err
	}
	index := int32(-1)
	t, tracked := p.top.Lookup(partition, now.UnixNano())
	if tracked {
		index = t.Aux
	}
	c, err := e.counter(ctx, p, partition, plan, index, now)
	c.Rate = t.Rate
	return c, err
}

func (e *Engine) counter(ctx context.Context, p *Policy, partition, plan string, index int32, now time.Time) (Counter, error) {
	l, planName, err := p.limitNamed(plan, index)
	if err != nil {
		return Counter{}, err
	}
	c := Counter{
		Policy: p.Name, Key: strings.TrimPrefix(strings.TrimPrefix(partition, p.prefix), ":"),
		Mode: p.Mode, Algorithm: p.Algorithm, Plan: planName,
		Limit: l.Limit.Limit, Window: l.Window, Unlimited: l.Unlimited,
	}
	if l.Unlimited {
		return c, nil
	}
	in, ok := p.limiter.(quota.Inspector)
	if !ok {
		return c, ErrNotCounted
	}
	c.Inspection, err = in.Inspect(ctx, partition, l.Limit, now)
	return c, err
}

// ResetCounter forgets key's count under the named policy wherever the
// policy's mode keeps it (in Redis for the Redis modes) and in this
// process, and returns the partition key, for the caller to tell the
// other replicas (see quota.Inspector's Forget).
func (e *Engine) ResetCounter(ctx context.Context, policy, key string) (string, error) {
	p, err := e.policy(policy)
	if err != nil {
		return "", err
	}
	partition, err := p.partitionOf(key)
	if err != nil {
		return "", err
	}
	in, ok := p.limiter.(quota.Inspector)
	if !ok {
		return "", ErrNotCounted
	}
	return partition, in.Reset(ctx, partition)
}

// TopCounters lists up to n of the named policy's keys by recent use on
// this replica (at most MaxTop), most used first, each with its count. A
// count that cannot be read (Redis unreachable) is reported in its
// entry's Err; the list is still returned.
func (e *Engine) TopCounters(ctx context.Context, policy string, n int, now time.Time) ([]Counter, error) {
	p, err := e.policy(policy)
	if err != nil {
		return nil, err
	}
	n = min(max(n, 0), MaxTop)
	var out []Counter
	for _, t := range p.top.Top(n, now.UnixNano()) {
		c, err := e.counter(ctx, p, t.Key, "", t.Aux, now)
		c.Policy, c.Rate, c.Err = p.Name, t.Rate, err
		c.Key = strings.TrimPrefix(strings.TrimPrefix(t.Key, p.prefix), ":")
		out = append(out, c)
	}
	return out, nil
}
