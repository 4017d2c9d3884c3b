package rls

import (
	"strings"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/extauthz/extauthz/internal/engine"
)

// keyPrefix starts every partition key of this door. A policy's keys start
// with its name, which cannot hold a '/', so no descriptor's count can be
// an ext_authz policy's (but a rate limit's that names the policy to
// count in, rate_limit.policy, whose key is the policy's: sharedPartition), and the Redis key scheme is the same for both:
// "rl:{rls/shop:user=ada}", the whole partition in the hash tag, so a
// Redis Cluster keeps each count on one node.
const keyPrefix = "rls/"

// partition is a descriptor's partition key: the domain and every entry's
// key and value (for an entry matched by a wildcard with share_threshold,
// the wildcard, so every value it matches counts together), each escaped
// as engine.AppendEntryPart does ('=' included), so no key or value
// forges another entry and a long one is replaced by its digest. steps is
// nil for a limit Envoy sent.
func partition(domain string, entries []*ratelimitv3.RateLimitDescriptor_Entry, steps []step) string {
	var buf [128]byte
	b := append(buf[:0], keyPrefix...)
	b = engine.AppendKeyValue(b, domain)
	for i, e := range entries {
		b = append(b, ':')
		b = engine.AppendEntryPart(b, e.GetKey())
		b = append(b, '=')
		v := e.GetValue()
		if steps != nil && steps[i].how == byWildcard && steps[i].node.d.ShareThreshold {
			v = steps[i].node.d.Value
		}
		b = engine.AppendEntryPart(b, v)
	}
	return string(b)
}

// sharedPartition is the key of a descriptor counting in policy p's
// bucket (rate_limit.policy): p's own partition key, the entries' values
// filling its key parts in order, so a Check of the same caller and this
// descriptor reach one count.
func sharedPartition(p *engine.Policy, entries []*ratelimitv3.RateLimitDescriptor_Entry) string {
	var buf [8]string
	values := buf[:0]
	for _, e := range entries {
		values = append(values, e.GetValue())
	}
	return p.PartitionFor(values)
}

// metricName is the name a dynamic rule's decision counts under, as
// envoyproxy/ratelimit names the stats: with detailed_metric,
// domain.key_value for every entry; with value_to_metric, the request's
// value in place of a descriptor without one (or a wildcard) where the
// flag is set. Values are escaped (non-printable bytes percent-encoded,
// long ones replaced by their digest) so a name stays short and valid.
func metricName(domain string, r *rule, entries []*ratelimitv3.RateLimitDescriptor_Entry, steps []step) string {
	return string(appendStatName(make([]byte, 0, 64), domain, r, entries, steps, engine.AppendKeyValue))
}

// anchorStatKey is the same name unescaped, as the anchor's stats spell
// it (internal/anchorstats replaces what the anchor replaces).
func anchorStatKey(domain string, r *rule, entries []*ratelimitv3.RateLimitDescriptor_Entry, steps []step) string {
	return string(appendStatName(make([]byte, 0, 64), domain, r, entries, steps, func(b []byte, v string) []byte { return append(b, v...) }))
}

// appendStatName appends a dynamic rule's stat name, each key and value
// appended by part.
func appendStatName(b []byte, domain string, r *rule, entries []*ratelimitv3.RateLimitDescriptor_Entry, steps []step, part func([]byte, string) []byte) []byte {
	b = part(b, domain)
	for i, e := range entries {
		st := steps[i]
		b = append(b, '.')
		b = part(b, e.GetKey())
		v := ""
		switch {
		case st.how == byWildcard && st.node.d.ShareThreshold:
			v = st.node.d.Value
		case r.detailed:
			v = e.GetValue()
		case st.how == byValue:
			v = st.node.d.Value
		case st.how == byWildcard && !st.node.d.ValueToMetric:
			v = st.node.d.Value
		case st.node.d.ValueToMetric:
			v = e.GetValue()
		}
		if v != "" {
			b = append(b, '_')
			b = part(b, v)
		}
	}
	return b
}

// anchorOverrideKey is the anchor's stat name of a limit Envoy sent: the
// domain and every entry's key_value (or key), dot-joined.
func anchorOverrideKey(domain string, entries []*ratelimitv3.RateLimitDescriptor_Entry) string {
	var b strings.Builder
	b.WriteString(domain)
	for _, e := range entries {
		b.WriteByte('.')
		b.WriteString(e.GetKey())
		if e.GetValue() != "" {
			b.WriteByte('_')
			b.WriteString(e.GetValue())
		}
	}
	return b.String()
}

// overrideName is the metric name of a limit Envoy sent: the domain and
// the entries' keys (their values would make a series per value).
func overrideName(domain string, entries []*ratelimitv3.RateLimitDescriptor_Entry) string {
	b := engine.AppendKeyValue(make([]byte, 0, 64), domain)
	for _, e := range entries {
		b = append(b, '.')
		b = engine.AppendKeyValue(b, e.GetKey())
	}
	return string(b)
}
