package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// CostKind is where a number read from each request comes from: a cost,
// or a limit (LimitSource).
type CostKind string

// The sources of a number read per request; "" is a constant.
const (
	CostConstant CostKind = ""
	CostHeader   CostKind = "header"
	CostClaim    CostKind = "claim"
	CostMetadata CostKind = "metadata"
)

// Cost is how many units one request spends of a policy's limit: a
// constant (1 unless configured), or a value read from each request with
// Units as its default. A missing or malformed value costs the default,
// never nothing.
type Cost struct {
	Units int64 // the constant cost, or the default of a value read per request
	// RequestValue is where the cost is read from; From is CostConstant
	// for Units on every request.
	RequestValue
}

// RequestValue is where a number is read from each request: a header a
// trusted filter sets, a verified JWT claim, or Envoy dynamic metadata.
type RequestValue struct {
	From CostKind
	// Name is the header (lower case), the claim, or the metadata key.
	Name string
	// Namespace is the Envoy filter metadata namespace (CostMetadata only),
	// such as envoy.filters.http.lua.
	Namespace string
}

// String names the value as validate prints it: "header:x-cost",
// "metadata:envoy.filters.http.lua/cost".
func (v RequestValue) String() string {
	if v.From == CostMetadata {
		return fmt.Sprintf("metadata:%s/%s", v.Namespace, v.Name)
	}
	return fmt.Sprintf("%s:%s", v.From, v.Name)
}

// String describes the cost as validate prints it: "3", "header:x-cost (default 1)".
func (c Cost) String() string {
	if c.From == CostConstant {
		return strconv.FormatInt(c.Units, 10)
	}
	return fmt.Sprintf("%s (default %d)", c.RequestValue, c.Units)
}

// rawCost is `cost: N` or `cost: {header|claim|metadata: ..., default: N}`.
type rawCost struct {
	Set      bool            `yaml:"-"` // the field was given
	Constant *int64          `yaml:"-"`
	Header   string          `yaml:"header"`
	Claim    string          `yaml:"claim"`
	Metadata *rawMetadataKey `yaml:"metadata"`
	Default  *int64          `yaml:"default"`
}

type rawMetadataKey struct {
	Namespace string `yaml:"namespace"`
	Key       string `yaml:"key"`
}

func (c *rawCost) decodeNode(n *yaml.Node, path string, errs *Errors) {
	c.Set = true
	switch n.Kind {
	case yaml.ScalarNode:
		var v int64
		if err := n.Decode(&v); err != nil {
			errs.add(path, "%q is not an integer or a mapping {header|claim|metadata: ..., default: N}", n.Value)
			return
		}
		c.Constant = &v
	case yaml.MappingNode:
		type fields rawCost // the same fields, without this method
		decodeValue(n, reflect.ValueOf((*fields)(c)).Elem(), path, errs)
	default:
		errs.add(path, "expected an integer or a mapping {header|claim|metadata: ..., default: N}, got %s", describe(n))
	}
}

// maxCostOf is the most units one request may cost under a limit: a
// token bucket's capacity (what it can hold at once), else the limit.
func maxCostOf(a Algorithm, limit, burst int64) (int64, string) {
	if a == TokenBucket && burst > 0 {
		return burst, "burst"
	}
	return limit, "limit"
}

// validateCost checks a policy's cost against every limit it may apply:
// an integer from 0 (ask without spending) to the most one request may
// take at once, and for a cost read per request, a default of at least 1,
// since a request whose value is missing or malformed is never free.
func validateCost(r *rawCost, path string, p *Policy, c *Config, errs *Errors) {
	p.Cost = Cost{Units: 1}
	if !r.Set {
		return
	}
	if p.Unlimited {
		errs.add(path, "an unlimited policy counts requests, not units; remove it")
		return
	}
	field := path
	if r.Constant != nil {
		p.Cost.Units = *r.Constant
	} else {
		var ok bool
		if p.Cost.RequestValue, ok = requestValue(r.Header, r.Claim, r.Metadata, path, "a constant, cost: N", errs); !ok {
			return
		}
		field = path + ".default"
		if r.Default != nil {
			p.Cost.Units = *r.Default
			if p.Cost.Units < 1 {
				errs.add(field, "%d must be at least 1: a request whose cost is missing or malformed is never free", p.Cost.Units)
				return
			}
		}
	}
	if p.Cost.Units < 0 {
		errs.add(field, "%d must be between 0 (ask without spending) and the limit", p.Cost.Units)
		return
	}
	if !p.UsePlan {
		limit, dynamic := p.Limit, p.LimitFrom.From != CostConstant
		if dynamic {
			// The most any request's limit may be: a request whose limit
			// is lower than its cost is denied it at once.
			limit = p.LimitFrom.Max
		}
		most, what := maxCostOf(p.Algorithm, limit, p.Burst)
		if dynamic && what == "limit" {
			what = "limit.max"
		}
		if limit > 0 && p.Cost.Units > most {
			errs.add(field, "%d is more than one request may take: the policy's %s is %d", p.Cost.Units, what, most)
		}
		return
	}
	for _, name := range sortedKeys(c.Plans) {
		plan := c.Plans[name]
		if plan.Unlimited {
			continue
		}
		if most, what := maxCostOf(p.Algorithm, plan.Limit, plan.Burst); p.Cost.Units > most {
			errs.add(field, "%d is more than one request may take under plans.%s: its %s is %d", p.Cost.Units, name, what, most)
		}
	}
}

// requestValue checks where a number is read from each request, given as
// exactly one of header, claim and metadata at path; other names the
// field's other shape in the message, such as "a constant, cost: N".
func requestValue(header, claim string, m *rawMetadataKey, path, other string, errs *Errors) (RequestValue, bool) {
	var v RequestValue
	sources := 0
	if header != "" {
		sources++
		v.From, v.Name = CostHeader, strings.ToLower(header)
		if !headerName.MatchString(header) {
			errs.add(path+".header", "%q is not a header name", header)
		}
	}
	if claim != "" {
		sources++
		v.From, v.Name = CostClaim, claim
	}
	if m != nil {
		sources++
		v.From, v.Name, v.Namespace = CostMetadata, m.Key, m.Namespace
		if m.Namespace == "" {
			errs.add(path+".metadata.namespace", "is required (the filter metadata namespace, such as envoy.filters.http.lua)")
		}
		if m.Key == "" {
			errs.add(path+".metadata.key", "is required")
		}
	}
	if sources != 1 {
		errs.add(path, "give exactly one of header, claim, metadata (or %s)", other)
		return RequestValue{}, false
	}
	return v, true
}
