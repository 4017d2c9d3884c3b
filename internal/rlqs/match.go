package rlqs

import (
	"slices"
	"strings"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/extauthz/extauthz/internal/engine"
)

// compiled is the rlqs section resolved against one Engine: every rule's
// policy is the Engine's own (the one Check decides with), so a bucket's
// takes reach the Check's count under the Check's key.
type compiled struct {
	eng     *engine.Engine
	domains map[string]*domain
}

type domain struct {
	name         string
	unknownAllow bool
	rules        []rule
}

type rule struct {
	match  map[string]string
	policy *engine.Policy
	key    []string
}

// compile resolves cfg's rlqs section against eng. config checked every
// name, so a policy is always found.
func compile(eng *engine.Engine) *compiled {
	byName := map[string]*engine.Policy{}
	for _, p := range eng.Policies() {
		byName[p.Name] = p
	}
	c := &compiled{eng: eng, domains: map[string]*domain{}}
	for _, d := range eng.Config().RLQS.Domains {
		cd := &domain{name: d.Name, unknownAllow: d.UnknownAllow}
		for _, b := range d.Buckets {
			if p := byName[b.Policy]; p != nil {
				cd.rules = append(cd.rules, rule{match: b.Match, policy: p, key: b.Key})
			}
		}
		c.domains[d.Name] = cd
	}
	return c
}

// target is where a bucket id counts: a policy and a partition key. A
// zero target (nil policy) is an unknown bucket.
type target struct {
	policy *engine.Policy
	key    string
}

// resolve maps a bucket id to the first rule whose match holds and whose
// key entries the id carries, and builds the policy's partition key from
// them, as PartitionFor does for a rate limit descriptor.
func (d *domain) resolve(id map[string]string) target {
	for i := range d.rules {
		r := &d.rules[i]
		if !matches(r.match, id) {
			continue
		}
		values := make([]string, len(r.key))
		ok := true
		for j, k := range r.key {
			v, present := id[k]
			if !present {
				ok = false
				break
			}
			values[j] = v
		}
		if !ok {
			continue
		}
		return target{policy: r.policy, key: r.policy.PartitionFor(values)}
	}
	return target{}
}

func matches(want, id map[string]string) bool {
	for k, v := range want {
		if got, ok := id[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// bucketKey is a bucket id's identity on a stream: its entries sorted by
// name, each escaped as partition keys are, so {a: A, b: B} and
// {b: B, a: A} are one bucket, as Envoy hashes them.
func bucketKey(id *rlqsv3.BucketId) string {
	m := id.GetBucket()
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, k := range names {
		b.Write(engine.AppendKeyValue(nil, k))
		b.WriteByte('=')
		b.Write(engine.AppendKeyValue(nil, m[k]))
		b.WriteByte(':')
	}
	return b.String()
}
