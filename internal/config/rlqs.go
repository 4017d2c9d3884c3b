package config

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// RLQS configures Envoy's rate limit quota service
// (envoy.service.rate_limit_quota.v3), served beside Check on the gRPC
// listener: Envoy's rate_limit_quota filter reports its buckets' usage and
// enforces the assignments the sidecar pushes. Each bucket id Envoy builds
// maps, by the first rule whose match holds, to a policy of this
// configuration and a partition key, so a tenant's count is the one its
// Check and its rate limit descriptors reach.
type RLQS struct {
	// Domains are the filter domains served, by the domain Envoy's filter
	// names in its first report. None: the door refuses every stream.
	Domains []RLQSDomain
	// AssignmentTTL is how long Envoy may enforce one assignment without
	// hearing from the sidecar again (whole seconds: Envoy reads only the
	// seconds). Assignments are renewed at every report, so it must be
	// longer than the filter's reporting_interval; it is shorter than
	// local.lease_ttl, so an Envoy that vanishes strands at most one
	// assignment's tokens, and for no longer than a lease would.
	AssignmentTTL time.Duration
	// MaxStreams bounds the Envoy streams this process serves at once; a
	// stream past it is refused with RESOURCE_EXHAUSTED.
	MaxStreams int
	// MaxBucketsPerStream bounds the buckets one stream holds assignments
	// for (and the entries of one report); a bucket past it gets its
	// domain's unknown_bucket answer and holds nothing.
	MaxBucketsPerStream int
}

// RLQSDomain is one filter domain's bucket rules.
type RLQSDomain struct {
	Name string
	// UnknownAllow answers a bucket no rule maps with ALLOW_ALL; by
	// default (unknown_bucket: deny) it gets DENY_ALL.
	UnknownAllow bool
	Buckets      []RLQSBucket
}

// RLQSBucket maps the bucket ids a rule matches to a policy's count.
type RLQSBucket struct {
	// Match holds bucket id entries that must be present with these
	// values; empty matches every bucket id.
	Match map[string]string
	// Policy names the policy whose count, limit, mode and algorithm
	// the bucket takes.
	Policy string
	// Key names the bucket id entries whose values fill the policy's key
	// parts, in order, as a Check's request fills them: bucket
	// {tenant: acme} with key [tenant] counts where a Check keyed by
	// header:x-tenant with x-tenant: acme counts.
	Key []string
}

// The rlqs section's defaults and bounds.
const (
	DefaultAssignmentTTL       = 3 * time.Second
	DefaultRLQSMaxStreams      = 1000
	DefaultRLQSMaxBuckets      = 10000
	maxRLQSBuckets             = 100000
	maxRLQSStreams             = 100000
	maxRLQSBucketIDEntries     = 16
	minAssignmentTTL           = time.Second
	rlqsUnknownBucketDeny      = "deny"
	rlqsUnknownBucketAllow     = "allow"
	rlqsUnknownBucketChoices   = "deny, allow"
	rlqsMatchEntriesMaxPerRule = maxRLQSBucketIDEntries
)

type rawRLQS struct {
	Domains             []rawRLQSDomain `yaml:"domains"`
	AssignmentTTL       string          `yaml:"assignment_ttl"`
	MaxStreams          int             `yaml:"max_streams"`
	MaxBucketsPerStream int             `yaml:"max_buckets_per_stream"`
}

type rawRLQSDomain struct {
	Name          string          `yaml:"name"`
	UnknownBucket string          `yaml:"unknown_bucket"`
	Buckets       []rawRLQSBucket `yaml:"buckets"`
}

type rawRLQSBucket struct {
	Match  map[string]string `yaml:"match"`
	Policy string            `yaml:"policy"`
	Key    []string          `yaml:"key"`
}

// validateRLQS checks the rlqs section against the policies (validated
// before it) and the hybrid lease life.
func validateRLQS(r *rawRLQS, c *Config, errs *Errors) RLQS {
	q := RLQS{AssignmentTTL: DefaultAssignmentTTL, MaxStreams: DefaultRLQSMaxStreams, MaxBucketsPerStream: DefaultRLQSMaxBuckets}
	if r.AssignmentTTL != "" {
		durationField(r.AssignmentTTL, "rlqs.assignment_ttl", &q.AssignmentTTL, errs)
		switch {
		case q.AssignmentTTL < minAssignmentTTL || q.AssignmentTTL%time.Second != 0:
			errs.add("rlqs.assignment_ttl", "%q must be whole seconds, at least 1s: Envoy reads an assignment's time to live in seconds only", r.AssignmentTTL)
		case q.AssignmentTTL >= c.Local.LeaseTTL:
			errs.add("rlqs.assignment_ttl", "%s must be shorter than local.lease_ttl (%s): an Envoy that vanishes may spend its assignment until it ends", q.AssignmentTTL, c.Local.LeaseTTL)
		}
	}
	if r.MaxStreams != 0 {
		q.MaxStreams = r.MaxStreams
		if r.MaxStreams < 1 || r.MaxStreams > maxRLQSStreams {
			errs.add("rlqs.max_streams", "%d must be between 1 and %d", r.MaxStreams, maxRLQSStreams)
		}
	}
	if r.MaxBucketsPerStream != 0 {
		q.MaxBucketsPerStream = r.MaxBucketsPerStream
		if r.MaxBucketsPerStream < 1 || r.MaxBucketsPerStream > maxRLQSBuckets {
			errs.add("rlqs.max_buckets_per_stream", "%d must be between 1 and %d", r.MaxBucketsPerStream, maxRLQSBuckets)
		}
	}
	policies := map[string]*Policy{}
	for i := range c.Policies {
		policies[c.Policies[i].Name] = &c.Policies[i]
	}
	seen := map[string]int{}
	for i, rd := range r.Domains {
		path := fmt.Sprintf("rlqs.domains[%d]", i)
		d := RLQSDomain{Name: rd.Name}
		switch {
		case rd.Name == "":
			errs.add(path+".name", "is empty; give the domain Envoy's rate_limit_quota filter is configured with")
		default:
			if prev, dup := seen[rd.Name]; dup {
				errs.add(path+".name", "%q is already used by rlqs.domains[%d]", rd.Name, prev)
			}
			seen[rd.Name] = i
		}
		switch rd.UnknownBucket {
		case "", rlqsUnknownBucketDeny:
		case rlqsUnknownBucketAllow:
			d.UnknownAllow = true
		default:
			errs.add(path+".unknown_bucket", "%q is not a choice; choices are %s", rd.UnknownBucket, rlqsUnknownBucketChoices)
		}
		for j, rb := range rd.Buckets {
			bpath := fmt.Sprintf("%s.buckets[%d]", path, j)
			d.Buckets = append(d.Buckets, validateRLQSBucket(rb, bpath, policies, errs))
		}
		q.Domains = append(q.Domains, d)
	}
	return q
}

func validateRLQSBucket(rb rawRLQSBucket, path string, policies map[string]*Policy, errs *Errors) RLQSBucket {
	b := RLQSBucket{Match: rb.Match, Policy: rb.Policy, Key: rb.Key}
	if len(rb.Match) > rlqsMatchEntriesMaxPerRule {
		errs.add(path+".match", "has %d entries; at most %d (a bucket id Envoy builds has a few)", len(rb.Match), rlqsMatchEntriesMaxPerRule)
	}
	for k := range rb.Match {
		if k == "" {
			errs.add(path+".match", "has an empty entry name")
		}
	}
	for i, k := range rb.Key {
		if k == "" {
			errs.add(fmt.Sprintf("%s.key[%d]", path, i), "is empty; name a bucket id entry")
		}
	}
	p, ok := policies[rb.Policy]
	switch {
	case rb.Policy == "":
		errs.add(path+".policy", "is missing; name the policy whose count the bucket takes; choices are %s", policyChoices(policies))
	case !ok:
		errs.add(path+".policy", "%q is not a policy; choices are %s", rb.Policy, policyChoices(policies))
	case p.UsePlan:
		errs.add(path+".policy", "%q takes its limit from the caller's plan (limit: plan), which a bucket id does not carry; name a policy with a limit of its own", rb.Policy)
	case p.LimitFrom.From != CostConstant:
		errs.add(path+".policy", "%q reads its limit from each request (limit_from), which Envoy enforces without asking; name a policy with a limit of its own", rb.Policy)
	case p.Cost.From != CostConstant || p.Cost.Units != 1:
		errs.add(path+".policy", "%q has a cost other than 1 per request; Envoy's filter counts requests", rb.Policy)
	case p.Charge == ChargeAlways:
		errs.add(path+".policy", "%q charges after the fact (charge: always); Envoy's filter admits from assignments the sidecar has already taken", rb.Policy)
	case p.Algorithm == LeakyBucket:
		errs.add(path+".policy", "%q is a leaky_bucket, whose requests are held until their slot; Envoy's filter only admits or denies; choose token_bucket or a window algorithm", rb.Policy)
	case len(p.Key) != len(rb.Key):
		errs.add(path+".key", "has %d entries and policy %q %d key parts (%s): the entries fill the policy's key parts in order, one each", len(rb.Key), rb.Policy, len(p.Key), keyPartList(p.Key))
	default:
		for _, k := range p.Key {
			if k.Kind == KeyIP {
				errs.add(path+".policy", "%q is keyed by ip, which the policy reads from the connection as no bucket id entry can repeat; key the policy by a header or claim", rb.Policy)
				break
			}
		}
	}
	return b
}

func policyChoices(policies map[string]*Policy) string {
	if len(policies) == 0 {
		return "(none: add a policy)"
	}
	names := make([]string, 0, len(policies))
	for n := range policies {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func keyPartList(ks []KeyPart) string {
	if len(ks) == 0 {
		return "none"
	}
	parts := make([]string, len(ks))
	for i, k := range ks {
		parts[i] = k.String()
	}
	return strings.Join(parts, ", ")
}
