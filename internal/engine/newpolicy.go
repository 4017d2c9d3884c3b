package engine

import (
	"fmt"
	"time"

	"github.com/extauthz/extauthz/internal/config"
)

// What a door with a configuration language of its own needs to decide
// through the engine: Envoy's rate limit service (internal/rls) matches
// envoyproxy/ratelimit's descriptors rather than our policies, but its
// rate limits are Policies like any other, with the same limiters,
// metrics, partition keys and TakeAll.

// NewPolicy compiles one policy outside a configuration's list: it decides
// with the limiter of p.Mode, counts its decisions under p.Name and p.Mode
// in m, and applies p.Limit units per p.Window (with p.Burst); p.UsePlan is
// not supported. Its Index and its Limit's Index are -1: it has no place in
// an Engine's numbering.
func NewPolicy(p config.Policy, limiters Limiters, m *Metrics) (*Policy, error) {
	lim, ok := limiters[p.Mode]
	if !ok || lim == nil {
		return nil, fmt.Errorf("%s: mode %s needs Redis, and this process started without a redis section (adding one takes a restart)", p.Name, p.Mode)
	}
	if p.UsePlan {
		return nil, fmt.Errorf("%s: limit: plan applies to the policies of a configuration only", p.Name)
	}
	pol := &Policy{
		Policy:          p,
		Index:           -1,
		limiter:         lim,
		prefix:          string(appendEscaped(nil, p.Name)),
		decisionMetrics: m.forPolicy(p.Name, string(p.Mode)),
	}
	pol.fixed = pol.NewLimit(p.Limit, p.Window)
	return pol, nil
}

// FixedLimit is the limit of a policy that does not take it from a plan.
func (p *Policy) FixedLimit() Limit { return p.fixed }

// NewLimit is the policy's limit with n units per window instead (its
// algorithm, burst and on_redis_error kept),
// for a limit given with the request (Envoy's per-descriptor override).
// Its Index is -1.
func (p *Policy) NewLimit(n int64, window time.Duration) Limit {
	l := compileLimit(p.Policy, n, window, p.Burst, nil)
	l.Index = -1
	return l
}

// CountedAs returns a copy of the policy whose decisions count under name
// in m (same mode, limiter and limits; its Name, which clients are told,
// stays), for a door whose metrics name a decision by the request's values
// (envoyproxy/ratelimit's detailed_metric). Each call creates the name's
// series: the caller bounds how many names it uses.
func (p *Policy) CountedAs(name string, m *Metrics) *Policy {
	c := *p
	c.decisionMetrics = m.forPolicy(name, string(p.Mode))
	return &c
}

// PartitionFor is the partition key p gives a request whose key parts'
// values are values, in order: what its Check computes from the request,
// for a door that is told the values (a rate limit descriptor's entries
// counting in p's bucket). A missing value is empty, as in Check. A key
// part of kind ip takes its value as given, not as Check formats the
// client address; the configuration refuses such a share.
func (p *Policy) PartitionFor(values []string) string {
	b := []byte(p.prefix)
	for i, k := range p.Key {
		b = appendKeyPart(b, k)
		if i < len(values) {
			b = appendEscaped(b, values[i])
		}
	}
	return string(b)
}

// AppendKeyValue appends v to a partition key as Decide's keys hold a
// request's values: the bytes that structure a key (':', the braces of
// the Redis hash tag, '%') and non-printable bytes percent-encoded, so no
// value forges another key, and a value longer than 128 bytes replaced by
// its digest, so a key stays short whatever a request carries.
func AppendKeyValue(b []byte, v string) []byte { return appendEscaped(b, v) }

// AppendEntryPart appends a rate limit descriptor entry's key or value to
// a partition key: escaped as AppendKeyValue escapes, and '=' too, since
// the rate limit service joins an entry's key to its value with '=' (left
// bare, the entries a=b:c and a:b=c shared a key). A key or value without
// '=' is spelled as before, so its count is where it was.
func AppendEntryPart(b []byte, v string) []byte { return appendEscapedAlso(b, v, '=') }
