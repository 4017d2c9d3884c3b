package rlsconfig

import (
	"fmt"
	"slices"
	"strings"

	"github.com/extauthz/extauthz/internal/config"
)

// The raw types mirror envoyproxy/ratelimit's YAML, plus extauthz's own
// rate_limit settings. Durations stay strings so that validation, which
// knows each field's path, reports bad values.

type rawFile struct {
	Domain      string          `yaml:"domain"`
	Descriptors []rawDescriptor `yaml:"descriptors"`
}

type rawDescriptor struct {
	Key            string          `yaml:"key"`
	Value          string          `yaml:"value"`
	RateLimit      *rawRateLimit   `yaml:"rate_limit"`
	Descriptors    []rawDescriptor `yaml:"descriptors"`
	ShadowMode     bool            `yaml:"shadow_mode"`
	DetailedMetric bool            `yaml:"detailed_metric"`
	ValueToMetric  bool            `yaml:"value_to_metric"`
	ShareThreshold bool            `yaml:"share_threshold"`
}

type rawRateLimit struct {
	Unit            string       `yaml:"unit"`
	RequestsPerUnit *int64       `yaml:"requests_per_unit"`
	Unlimited       bool         `yaml:"unlimited"`
	Name            string       `yaml:"name"`
	Replaces        []rawReplace `yaml:"replaces"`
	// extauthz's own.
	Algorithm    string `yaml:"algorithm"`
	Mode         string `yaml:"mode"`
	OnRedisError string `yaml:"on_redis_error"`
	Burst        int64  `yaml:"burst"`
	Queue        *int64 `yaml:"queue"`
	MaxDelay     string `yaml:"max_delay"`
	Charge       string `yaml:"charge"`
	Policy       string `yaml:"policy"`
}

type rawReplace struct {
	Name string `yaml:"name"`
}

func parse(data []byte, name string, o Options) (*Domain, []string, error) {
	var raw rawFile
	errs := config.DecodeYAML(data, name, &raw)
	if err := errs.Err(); err != nil {
		return nil, nil, err
	}
	v := &validator{file: name, place: limitPlace(o), errs: errs, policies: o.Policies}
	if o.Source != "" {
		v.source = " (" + o.Source + ")"
	}
	d := &Domain{Name: raw.Domain, File: name}
	if raw.Domain == "" {
		errs.Add("domain", "is required: the domain Envoy's rate limit filter names")
	}
	d.Descriptors = v.descriptors(raw.Descriptors, "", 1)
	if err := errs.Err(); err != nil {
		return nil, v.warnings, err
	}
	return d, v.warnings, nil
}

// limitPlace is where a descriptor's rate_limit is written: a file beside
// the main configuration, whose redis section and local bounds apply, and
// whose leaky buckets hold a ShouldRateLimit call, which Envoy's rate
// limit filter gives 20ms by default (so nothing is held unless asked).
func limitPlace(o Options) config.LimitPlace {
	p := config.LimitPlace{
		CountField:       "requests_per_unit",
		DefaultAlgorithm: config.FixedWindow,
		DefaultMode:      o.DefaultMode,
		Redis:            o.Redis,
		RedisSection:     "a redis section in the main configuration",
		ZeroMaxDelay:     true,
		HeldCall:         "a held request is an open ShouldRateLimit call, which Envoy's rate limit filter gives 20ms by default",
		Local:            o.Local,
	}
	if p.DefaultMode == "" {
		p.DefaultMode = config.ModeLocal
	}
	if p.Local.MaxKeys == 0 {
		p.Local.MaxKeys = config.DefaultMaxKeys
	}
	if p.Local.MaxLogBytes == 0 {
		p.Local.MaxLogBytes = config.DefaultMaxLogBytes
	}
	return p
}

// validator checks one file.
type validator struct {
	file     string
	place    config.LimitPlace
	errs     *config.Errors
	warnings []string
	policies map[string]*config.Policy
	source   string // " (main.yaml)" for messages, or ""
}

func (v *validator) warn(path, format string, args ...any) {
	v.warnings = append(v.warnings, fmt.Sprintf("%s: %s: %s", v.file, path, fmt.Sprintf(format, args...)))
}

func (v *validator) descriptors(raws []rawDescriptor, parent string, depth int) []*Descriptor {
	out := make([]*Descriptor, 0, len(raws))
	seen := map[[2]string]int{}
	for i := range raws {
		r := &raws[i]
		path := fmt.Sprintf("%sdescriptors[%d]", parent, i)
		if depth > MaxDepth {
			v.errs.Add(path, "nests deeper than %d levels", MaxDepth)
			return out
		}
		d := &Descriptor{
			Key:            r.Key,
			Value:          r.Value,
			Path:           path,
			Shadow:         r.ShadowMode,
			DetailedMetric: r.DetailedMetric,
			ValueToMetric:  r.ValueToMetric,
			ShareThreshold: r.ShareThreshold,
		}
		if r.Key == "" {
			v.errs.Add(path+".key", "is required")
		}
		if prev, dup := seen[[2]string{r.Key, r.Value}]; dup {
			if r.Value == "" {
				v.errs.Add(path, "key %q without a value is already described by %sdescriptors[%d]", r.Key, parent, prev)
			} else {
				v.errs.Add(path, "key %q with value %q is already described by %sdescriptors[%d]", r.Key, r.Value, parent, prev)
			}
		}
		seen[[2]string{r.Key, r.Value}] = i
		if strings.Contains(r.Value, "*") {
			d.Wildcard = strings.Split(r.Value, "*")
		} else if r.ShareThreshold {
			v.errs.Add(path+".share_threshold", "applies to wildcard values (with a *), not %q", r.Value)
		}
		if r.RateLimit != nil {
			d.Limit = v.rateLimit(r.RateLimit, path+".rate_limit", depth)
		}
		if r.ShadowMode && d.Limit == nil {
			v.warn(path+".shadow_mode", "has no effect without a rate_limit at this level")
		}
		d.Descriptors = v.descriptors(r.Descriptors, path+".", depth+1)
		out = append(out, d)
	}
	return out
}

func (v *validator) rateLimit(r *rawRateLimit, path string, depth int) *RateLimit {
	l := &RateLimit{Name: r.Name, Unlimited: r.Unlimited}
	for i, rep := range r.Replaces {
		p := fmt.Sprintf("%s.replaces[%d].name", path, i)
		switch {
		case rep.Name == "":
			v.errs.Add(p, "is required: the name of the rate limit to replace")
		case rep.Name == r.Name:
			v.errs.Add(p, "%q is this rate limit's own name", rep.Name)
		default:
			l.Replaces = append(l.Replaces, rep.Name)
		}
	}
	if r.Policy != "" {
		v.sharedPolicy(r, l, path, depth)
		return l
	}
	if r.Unlimited {
		// An unlimited descriptor is never counted: nothing else applies.
		for _, f := range []struct {
			name string
			set  bool
		}{
			{"unit", r.Unit != ""}, {"algorithm", r.Algorithm != ""}, {"mode", r.Mode != ""},
			{"on_redis_error", r.OnRedisError != ""}, {"burst", r.Burst != 0}, {"queue", r.Queue != nil}, {"max_delay", r.MaxDelay != ""},
			{"charge", r.Charge != ""},
		} {
			if f.set {
				v.errs.Add(path+"."+f.name, "has no meaning with unlimited: true")
			}
		}
		if r.RequestsPerUnit != nil {
			v.warn(path+".requests_per_unit", "is ignored with unlimited: true")
		}
		return l
	}

	l.Unit = strings.ToLower(r.Unit)
	switch w, ok := Units[l.Unit]; {
	case r.Unit == "":
		v.errs.Add(path+".unit", "is required; choices are %s", strings.Join(unitNames, ", "))
	case !ok:
		v.errs.Add(path+".unit", "%q is not a unit; choices are %s", r.Unit, strings.Join(unitNames, ", "))
	default:
		l.Window = w
	}
	switch {
	case r.RequestsPerUnit == nil:
		v.errs.Add(path+".requests_per_unit", "is required (0 puts every request over the limit)")
	case *r.RequestsPerUnit < 0 || *r.RequestsPerUnit > MaxRequestsPerUnit:
		v.errs.Add(path+".requests_per_unit", "%d must be between 0 and %d", *r.RequestsPerUnit, int64(MaxRequestsPerUnit))
	default:
		l.RequestsPerUnit = *r.RequestsPerUnit
	}

	set := config.ValidateLimit(&config.LimitFields{
		Algorithm:    r.Algorithm,
		Burst:        r.Burst,
		Queue:        r.Queue,
		MaxDelay:     r.MaxDelay,
		Mode:         r.Mode,
		OnRedisError: r.OnRedisError,
		Charge:       r.Charge,
		Counts:       []config.LimitCount{{N: l.RequestsPerUnit, Window: l.Window}},
	}, path, &v.place, v.errs)
	l.Algorithm, l.Burst, l.Queue, l.MaxDelay, l.Mode, l.OnRedisError = set.Algorithm, r.Burst, set.Queue, set.MaxDelay, set.Mode, set.OnRedisError
	l.Charge = set.Charge
	return l
}

// sharedPolicy checks a rate_limit that counts in a policy's bucket
// (policy: NAME): the limit is the policy's, whole, and the descriptor's
// entries, depth of them, fill the policy's key parts in order.
func (v *validator) sharedPolicy(r *rawRateLimit, l *RateLimit, path string, depth int) {
	l.Policy = r.Policy
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"unit", r.Unit != ""}, {"requests_per_unit", r.RequestsPerUnit != nil}, {"unlimited", r.Unlimited},
		{"algorithm", r.Algorithm != ""}, {"mode", r.Mode != ""}, {"on_redis_error", r.OnRedisError != ""},
		{"burst", r.Burst != 0}, {"queue", r.Queue != nil}, {"max_delay", r.MaxDelay != ""}, {"charge", r.Charge != ""},
	} {
		if f.set {
			v.errs.Add(path+"."+f.name, "comes from policy %s with policy: set; remove it", r.Policy)
		}
	}
	p, ok := v.policies[r.Policy]
	switch {
	case !ok:
		v.errs.Add(path+".policy", "%q is not a policy of the main configuration%s; choices are %s", r.Policy, v.source, v.policyNames())
	case p.Unlimited || p.UsePlan:
		v.errs.Add(path+".policy", "%q has no count of its own to share (an unlimited policy, or limit: plan)", r.Policy)
	case p.Calendar:
		v.errs.Add(path+".policy", "%q counts calendar windows, which only its Check door aligns to its time zone; share a policy whose window is a duration", r.Policy)
	case len(p.Key) != depth:
		v.errs.Add(path+".policy", "%q has %d key parts (%s) and this descriptor %d entries: a request's entries fill the policy's key parts in order, one each", r.Policy, len(p.Key), keyParts(p.Key), depth)
	default:
		for _, k := range p.Key {
			if k.Kind == config.KeyIP {
				v.errs.Add(path+".policy", "%q is keyed by ip, which the policy reads from the connection and forwarded headers as no descriptor entry can repeat; key the policy by a header or claim", r.Policy)
				break
			}
		}
		l.Algorithm, l.Mode, l.OnRedisError, l.Charge = p.Algorithm, p.Mode, p.OnRedisError, p.Charge
	}
}

func keyParts(ks []config.KeyPart) string {
	if len(ks) == 0 {
		return "none"
	}
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = k.String()
	}
	return strings.Join(s, ", ")
}

func (v *validator) policyNames() string {
	names := make([]string, 0, len(v.policies))
	for n := range v.policies {
		names = append(names, n)
	}
	if len(names) == 0 {
		return "none (the main configuration has no policies)"
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
