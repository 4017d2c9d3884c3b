package deploy

import (
	"fmt"
	"sort"
	"time"

	xdsmatcherv3 "github.com/cncf/xds/go/xds/type/matcher/v3"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	hcmv3http "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// Envoy's rate limit quota filter with extauthz as its rate limit quota
// service (RLQS): `extauthz validate` checks the rlqs section; these
// checks tie it to Envoy's side: the filter calls where extauthz
// listens, names one of its domains, builds only bucket ids a rule maps,
// falls back to DENY_ALL (Envoy's default, ALLOW_ALL, admits without any
// count) and reports more often than an assignment lives, so every
// assignment is renewed before it ends.

// rlqsDefaultTTL is rlqs.assignment_ttl's default (internal/config).
const rlqsDefaultTTL = 3 * time.Second

// rlqsSection is the part of the rlqs section these checks read.
type rlqsSection struct {
	AssignmentTTL string `json:"assignment_ttl"`
	Domains       []struct {
		Name    string `json:"name"`
		Buckets []struct {
			Match  map[string]string `json:"match"`
			Policy string            `json:"policy"`
			Key    []string          `json:"key"`
		} `json:"buckets"`
	} `json:"domains"`
}

// rlqsFilterOf returns the rate limit quota filter of an HTTP filter
// chain, or nil.
func rlqsFilterOf(filters []*hcmv3http.HttpFilter) *rlqsv3.RateLimitQuotaFilterConfig {
	for _, f := range filters {
		if q, ok := unpack[*rlqsv3.RateLimitQuotaFilterConfig](f.GetTypedConfig()); ok {
			return q
		}
	}
	return nil
}

func checkRLQSBootstrap(p *problems, name string, b *bootstrapv3.Bootstrap, q *rlqsv3.RateLimitQuotaFilterConfig, sc *sidecarConfig) {
	cluster := q.GetRlqsServer().GetEnvoyGrpc().GetClusterName()
	if cluster == "" {
		p.add("%s: the rate_limit_quota filter's rlqs_server is not an envoy_grpc cluster", name)
	} else {
		checkExtAuthzCluster(p, name, b, cluster, sc)
	}
	ttl := rlqsDefaultTTL
	if sc.RLQS.AssignmentTTL != "" {
		if d, err := time.ParseDuration(sc.RLQS.AssignmentTTL); err == nil {
			ttl = d
		}
	}
	var rules [][3]any // per rule: match, key
	found := false
	for _, d := range sc.RLQS.Domains {
		if d.Name != q.GetDomain() {
			continue
		}
		found = true
		for _, r := range d.Buckets {
			rules = append(rules, [3]any{r.Match, r.Key, r.Policy})
		}
	}
	if !found {
		p.add("%s: the rate_limit_quota filter's domain %q is not one of extauthz's rlqs.domains: every stream would be refused", name, q.GetDomain())
		return
	}
	settings := bucketSettings(q.GetBucketMatchers())
	if len(settings) == 0 {
		p.add("%s: the rate_limit_quota filter's bucket_matchers build no bucket: it never reports", name)
	}
	for i, s := range settings {
		where := fmt.Sprintf("%s: bucket_matchers action %d", name, i)
		if ri := s.GetReportingInterval().AsDuration(); ri <= 0 || ri >= ttl {
			p.add("%s: reporting_interval %s is not shorter than extauthz's rlqs.assignment_ttl %s: assignments would end before their renewal", where, ri, ttl)
		}
		if s.GetNoAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
			p.add("%s: no_assignment_behavior is not DENY_ALL: a new bucket, or one whose assignment ran out, would admit without any count", where)
		}
		if e := s.GetExpiredAssignmentBehavior(); e != nil && (e.GetReuseLastAssignment() != nil || e.GetFallbackRateLimit().GetTokenBucket() != nil || e.GetFallbackRateLimit().GetBlanketRule() == typev3.RateLimitStrategy_ALLOW_ALL) {
			p.add("%s: expired_assignment_behavior keeps admitting after an assignment ends; extauthz paid for it only until then", where)
		}
		static := map[string]string{}
		var names []string
		for k, v := range s.GetBucketIdBuilder().GetBucketIdBuilder() {
			names = append(names, k)
			if v.GetCustomValue() == nil {
				static[k] = v.GetStringValue()
			}
		}
		sort.Strings(names)
		if !anyRuleMaps(rules, static, names) {
			p.add("%s: builds bucket ids with %v (static %v) that no rule of extauthz's domain %q maps: every request would get unknown_bucket", where, names, static, q.GetDomain())
		}
	}
}

// anyRuleMaps reports whether a rule maps the bucket ids a builder makes:
// its match entries are static values the builder sets, and its key
// entries are names the builder sets.
func anyRuleMaps(rules [][3]any, static map[string]string, names []string) bool {
	has := map[string]bool{}
	for _, n := range names {
		has[n] = true
	}
	for _, r := range rules {
		match, key := r[0].(map[string]string), r[1].([]string)
		ok := true
		for k, v := range match {
			if got, set := static[k]; !set || got != v {
				ok = false
			}
		}
		for _, k := range key {
			if !has[k] {
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// bucketSettings returns every RateLimitQuotaBucketSettings a matcher
// tree's actions carry.
func bucketSettings(m *xdsmatcherv3.Matcher) []*rlqsv3.RateLimitQuotaBucketSettings {
	if m == nil {
		return nil
	}
	var out []*rlqsv3.RateLimitQuotaBucketSettings
	var onMatch func(om *xdsmatcherv3.Matcher_OnMatch)
	onMatch = func(om *xdsmatcherv3.Matcher_OnMatch) {
		if om == nil {
			return
		}
		if s, ok := unpack[*rlqsv3.RateLimitQuotaBucketSettings](om.GetAction().GetTypedConfig()); ok {
			out = append(out, s)
		}
		out = append(out, bucketSettings(om.GetMatcher())...)
	}
	for _, fm := range m.GetMatcherList().GetMatchers() {
		onMatch(fm.GetOnMatch())
	}
	for _, om := range m.GetMatcherTree().GetExactMatchMap().GetMap() {
		onMatch(om)
	}
	for _, om := range m.GetMatcherTree().GetPrefixMatchMap().GetMap() {
		onMatch(om)
	}
	onMatch(m.GetOnNoMatch())
	return out
}
