package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// CostKind is where a request's cost is read from.
type CostKind string

// The sources of a cost; "" is a constant.
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
	Units int64    // the constant cost, or the default of a value read per request
	From  CostKind // CostConstant: Units for every request
	// Name is the header (lower case), the claim, or the metadata key.
	Name string
	// Namespace is the Envoy filter metadata namespace (CostMetadata only),
	// such as envoy.filters.http.lua.
	Namespace string
}

// String describes the cost as validate prints it: "3", "header:x-cost (default 1)".
func (c Cost) String() string {
	switch c.From {
	case CostConstant:
		return strconv.FormatInt(c.Units, 10)
	case CostMetadata:
		return fmt.Sprintf("metadata:%s/%s (default %d)", c.Namespace, c.Name, c.Units)
	}
	return fmt.Sprintf("%s:%s (default %d)", c.From, c.Name, c.Units)
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
		sources := 0
		if r.Header != "" {
			sources++
			p.Cost.From, p.Cost.Name = CostHeader, strings.ToLower(r.Header)
			if !headerName.MatchString(r.Header) {
				errs.add(path+".header", "%q is not a header name", r.Header)
			}
		}
		if r.Claim != "" {
			sources++
			p.Cost.From, p.Cost.Name = CostClaim, r.Claim
		}
		if m := r.Metadata; m != nil {
			sources++
			p.Cost.From, p.Cost.Name, p.Cost.Namespace = CostMetadata, m.Key, m.Namespace
			if m.Namespace == "" {
				errs.add(path+".metadata.namespace", "is required (the filter metadata namespace, such as envoy.filters.http.lua)")
			}
			if m.Key == "" {
				errs.add(path+".metadata.key", "is required")
			}
		}
		if sources != 1 {
			errs.add(path, "give exactly one of header, claim, metadata (or a constant, cost: N)")
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
		if most, what := maxCostOf(p.Algorithm, p.Limit, p.Burst); p.Limit > 0 && p.Cost.Units > most {
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
