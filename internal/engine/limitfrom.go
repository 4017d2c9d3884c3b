package engine

import (
	"context"
	"log/slog"
	"math"
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/extauthz/extauthz/internal/config"
)

// Design note: a policy's limit may be read from each request
// (config.LimitSource), so a tenant's limit can travel in a verified JWT
// claim, in Envoy metadata or in a header a trusted gateway sets. It is
// read as a cost is (readNumber): a whole number, and here at least 1,
// since a limit of 0 is no limit a caller may carry. A value that is
// missing or malformed gets the policy's default, counted in
// extauthz_limit_defaulted_total as costs are in
// extauthz_cost_defaulted_total; a value above max gets max, counted in
// extauthz_limit_clamped_total: the operator's max is a ceiling a request
// cannot lift, and a tenant granted more than it is still admitted what
// max allows rather than dropped to the default. Each is logged once per
// configuration.
//
// The window, algorithm, burst and mode are the policy's; a token
// bucket's capacity follows the limit unless burst is set. The key is the
// policy's too, whatever the limit: every algorithm, in every store, takes
// the limit with each call and keeps only what was spent (tokens in use,
// a window's count, a log's instants), so a key whose limit changes
// between calls is counted against the new limit at once (a tenant raised
// from 100 to 1000 mid-window gets 900 more, not a fresh 1000). Hybrid
// leases sized under another limit are handed back first
// (redisstore.Hybrid). Key a policy by the identity its limit belongs to,
// such as the claim:sub beside a claim:rpm: callers of different limits
// sharing one key are each held to their own limit against one count.
//
// The default's and max's limits are compiled with the policy, headers
// and all; a limit between them is built per request, its
// RateLimit-Policy rendered then (Index -1: doors render it from Header).

// limitReader is a policy's limit read per request; nil for a limit of
// its own or a plan's.
type limitReader struct {
	defaulted     [costProblems]prometheus.Counter
	clamped       prometheus.Counter
	warnedDefault atomic.Bool // a defaulted limit was logged under this configuration
	warnedClamp   atomic.Bool // a clamped limit was logged under this configuration
}

func (m *Metrics) forLimit(policy string) *limitReader {
	r := &limitReader{clamped: m.LimitClamped.WithLabelValues(policy)}
	for i, name := range costProblemNames {
		r.defaulted[i] = m.LimitDefaulted.WithLabelValues(policy, name)
	}
	return r
}

// limitOf returns the limit that applies to request a from client c
// under p: read from the request when p says so, else p.limitFor's.
func (e *Engine) limitOf(ctx context.Context, p *Policy, a *Request, c *Client) Limit {
	if p.LimitFrom.From == config.CostConstant {
		return p.limitFor(a, c)
	}
	n, problem := readNumber(a, &p.LimitFrom.RequestValue)
	if problem < 0 && n < 1 {
		problem = costMalformed
	}
	r := p.limitReader
	switch {
	case problem >= 0:
		r.defaulted[problem].Inc()
		if e.warn != nil && r.warnedDefault.CompareAndSwap(false, true) {
			e.warn.LogAttrs(ctx, slog.LevelWarn, "a request's limit is "+costProblemNames[problem]+"; applying the policy's default (logged once per configuration, counted in extauthz_limit_defaulted_total)",
				slog.String("policy", p.Name), slog.String("limit", p.LimitFrom.String()))
		}
		return p.fixed
	case n > p.LimitFrom.Max:
		r.clamped.Inc()
		if e.warn != nil && r.warnedClamp.CompareAndSwap(false, true) {
			e.warn.LogAttrs(ctx, slog.LevelWarn, "a request's limit is above the policy's max; applying max (logged once per configuration, counted in extauthz_limit_clamped_total)",
				slog.String("policy", p.Name), slog.String("limit", p.LimitFrom.String()), slog.String("value", strconv.FormatInt(n, 10)))
		}
		return p.ceiling
	}
	return p.limitOfValue(n)
}

// limitOfValue is p's limit of n units per window, for n from 1 to its
// max.
func (p *Policy) limitOfValue(n int64) Limit {
	switch n {
	case p.LimitFrom.Default:
		return p.fixed
	case p.LimitFrom.Max:
		return p.ceiling
	}
	l := p.fixed
	l.Limit.Limit = n
	l.Header = policyHeader(p.Name, n, l.Window)
	l.Index = -1
	return l
}

// usageAux is what the counters API's record of key use keeps of a
// decision under l: the limit's Index, or for a limit read per request
// the limit itself (Index is -1 between default and max), so that a
// key's count is read under the limit its last request had.
func (p *Policy) usageAux(l *Limit) int32 {
	if p.limitReader != nil {
		return int32(min(l.Limit.Limit, math.MaxInt32))
	}
	return int32(l.Index)
}
