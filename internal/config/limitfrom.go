package config

import (
	"fmt"
	"reflect"

	"go.yaml.in/yaml/v3"
)

// LimitSource is a policy's limit read from each request (`limit: {claim:
// NAME, default: N, max: M}`), so a tenant's limit can travel in its JWT
// or in Envoy metadata instead of a plan per tenant. A value that is
// missing or malformed (not a whole number of at least 1) gets Default; a
// value above Max gets Max: what a request carries never raises its limit
// above what the operator allows. The window, the algorithm and the rest
// are the policy's.
type LimitSource struct {
	// RequestValue is where the limit is read from; From is CostConstant
	// for a policy whose limit is its own number (or plan).
	RequestValue
	Default int64 // units per window when the value is missing or malformed; also Policy.Limit
	Max     int64 // the most units per window a request's value may give
}

// String describes the limit's source as validate prints it:
// "claim:rpm (default 100, max 1000)".
func (l LimitSource) String() string {
	return fmt.Sprintf("%s (default %d, max %d)", l.RequestValue, l.Default, l.Max)
}

// rawLimit is `limit: N`, `limit: plan` or `limit: {header|claim|metadata:
// ..., default: N, max: M}`.
type rawLimit struct {
	Set   bool          `yaml:"-"` // the field was given
	Value string        `yaml:"-"` // a scalar: a number or plan
	From  *rawLimitFrom `yaml:"-"` // a mapping
}

type rawLimitFrom struct {
	Header   string          `yaml:"header"`
	Claim    string          `yaml:"claim"`
	Metadata *rawMetadataKey `yaml:"metadata"`
	Default  *int64          `yaml:"default"`
	Max      *int64          `yaml:"max"`
}

const limitShapes = "an integer, plan, or a mapping {header|claim|metadata: ..., default: N, max: M}"

func (l *rawLimit) decodeNode(n *yaml.Node, path string, errs *Errors) {
	l.Set = true
	switch n.Kind {
	case yaml.ScalarNode:
		l.Value = n.Value
	case yaml.MappingNode:
		l.From = &rawLimitFrom{}
		decodeValue(n, reflect.ValueOf(l.From).Elem(), path, errs)
	default:
		errs.add(path, "expected %s, got %s", limitShapes, describe(n))
	}
}

// validateLimitFrom checks the limit read per request of the policy at
// path and sets p's LimitSource, with Policy.Limit its default. The window is the policy's
// own; a burst, when given, is the bucket's capacity whatever the limit,
// so it must refill within maxRefill at the lowest limit a request can
// have, 1 per window.
func validateLimitFrom(r *rawLimitFrom, window string, burst int64, path string, p *Policy, errs *Errors) {
	if window == "" {
		errs.add(path+".window", "is required")
	} else {
		p.Window, p.Period = parseWindow(window, path+".window", errs)
	}
	refillField(1, p.Window, burst, path+".burst", errs)
	path += ".limit"
	v, ok := requestValue(r.Header, r.Claim, r.Metadata, path, "a number, limit: N, or limit: plan", errs)
	if !ok {
		return
	}
	p.LimitFrom.RequestValue = v
	bounded := func(field string, n *int64, why string) int64 {
		if n == nil {
			errs.add(path+"."+field, "is required: %s", why)
			return 0
		}
		if *n < 1 || *n > maxLimit {
			errs.add(path+"."+field, "%d must be between 1 and %d", *n, int64(maxLimit))
			return 0
		}
		return *n
	}
	p.LimitFrom.Max = bounded("max", r.Max, "the most units per window a request's value may give (values above it are clamped to it)")
	p.LimitFrom.Default = bounded("default", r.Default, "the limit of a request whose value is missing or malformed")
	if d, m := p.LimitFrom.Default, p.LimitFrom.Max; d > 0 && m > 0 && d > m {
		errs.add(path+".default", "%d is above max %d", d, m)
	}
	p.Limit = p.LimitFrom.Default
}
