package rlsconfig

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/extauthz/extauthz/internal/config"
)

// The raw types mirror envoyproxy/ratelimit's YAML, plus extauthz's own
// rate_limit settings. Durations stay strings so that validation, which
// knows each field's path, reports bad values.

type rawFile struct {
	// Name is the configuration's name, as Envoy Gateway writes it (the
	// xDS resource's); envoyproxy/ratelimit accepts and ignores it.
	Name        string          `yaml:"name"`
	Domain      string          `yaml:"domain"`
	Descriptors []rawDescriptor `yaml:"descriptors"`
}

type rawDescriptor struct {
	Key            string          `yaml:"key"`
	Value          string          `yaml:"value"`
	RateLimit      *rawRateLimit   `yaml:"rate_limit"`
	RateLimits     []rawRateLimit  `yaml:"rate_limits"` // several limits, all of which must allow
	Descriptors    []rawDescriptor `yaml:"descriptors"`
	ShadowMode     bool            `yaml:"shadow_mode"`
	QuotaMode      bool            `yaml:"quota_mode"`
	DetailedMetric bool            `yaml:"detailed_metric"`
	ValueToMetric  bool            `yaml:"value_to_metric"`
	ShareThreshold bool            `yaml:"share_threshold"`
}

type rawRateLimit struct {
	Unit            string       `yaml:"unit"`
	UnitMultiplier  *int64       `yaml:"unit_multiplier"` // Envoy's RateLimit API's: the window is unit × unit_multiplier
	Window          string       `yaml:"window"`          // a duration, in place of unit and unit_multiplier
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
	BlockFor     string `yaml:"block_for"`
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
			Quota:          r.QuotaMode,
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
		d.Limits = v.rateLimits(r, path, depth)
		if len(d.Limits) > 0 {
			d.Limit = d.Limits[0]
		}
		if r.ShadowMode && d.Limit == nil {
			v.warn(path+".shadow_mode", "has no effect without a rate_limit at this level")
		}
		if r.QuotaMode && d.Limit == nil {
			v.warn(path+".quota_mode", "has no effect without a rate_limit at this level")
		}
		d.Descriptors = v.descriptors(r.Descriptors, path+".", depth+1)
		out = append(out, d)
	}
	return out
}

// rateLimits checks a descriptor's limits: its rate_limit (what
// envoyproxy/ratelimit reads), or its list of rate_limits, which must all
// allow a request. Each limit of a list is counted apart, by its window,
// so a list has one limit per window.
func (v *validator) rateLimits(r *rawDescriptor, path string, depth int) []*RateLimit {
	switch {
	case r.RateLimit != nil && r.RateLimits != nil:
		v.errs.Add(path+".rate_limits", "give rate_limit (one limit) or rate_limits (several), not both")
		return nil
	case r.RateLimit != nil:
		return []*RateLimit{v.rateLimit(r.RateLimit, path+".rate_limit", depth)}
	case r.RateLimits == nil:
		return nil
	case len(r.RateLimits) == 0:
		v.errs.Add(path+".rate_limits", "is empty; give at least one limit, or leave it out")
		return nil
	}
	if len(r.RateLimits) > MaxLimits {
		v.errs.Add(path+".rate_limits", "has %d limits; at most %d (one per window)", len(r.RateLimits), MaxLimits)
		return nil
	}
	out := make([]*RateLimit, 0, len(r.RateLimits))
	windows := map[time.Duration]int{}
	for i := range r.RateLimits {
		raw := &r.RateLimits[i]
		p := fmt.Sprintf("%s.rate_limits[%d]", path, i)
		l := v.rateLimit(raw, p, depth)
		if l.Unlimited && len(r.RateLimits) > 1 {
			v.errs.Add(p+".unlimited", "stands alone: beside it, the other limits of rate_limits would never apply")
		}
		if prev, dup := windows[l.Window]; dup && l.Window > 0 {
			v.errs.Add(p, "its window, %s, is already rate_limits[%d]'s; a descriptor has one limit per window (keep the stricter, or change one's window)", FormatWindow(l.Window), prev)
		} else if l.Window > 0 {
			windows[l.Window] = i
		}
		for j, rep := range l.Replaces {
			for k := range r.RateLimits {
				if k != i && rep != "" && r.RateLimits[k].Name == rep {
					v.errs.Add(fmt.Sprintf("%s.replaces[%d].name", p, j), "%q names rate_limits[%d] of this same descriptor; replaces removes the limits of other descriptors", rep, k)
				}
			}
		}
		out = append(out, l)
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
			{"unit", r.Unit != ""}, {"unit_multiplier", r.UnitMultiplier != nil}, {"window", r.Window != ""},
			{"algorithm", r.Algorithm != ""}, {"mode", r.Mode != ""},
			{"on_redis_error", r.OnRedisError != ""}, {"burst", r.Burst != 0}, {"queue", r.Queue != nil}, {"max_delay", r.MaxDelay != ""},
			{"charge", r.Charge != ""}, {"block_for", r.BlockFor != ""},
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

	v.window(r, path, l)
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
		BlockFor:     r.BlockFor,
		Counts:       []config.LimitCount{{N: l.RequestsPerUnit, Window: l.Window}},
	}, path, &v.place, v.errs)
	l.Algorithm, l.Burst, l.Queue, l.MaxDelay, l.Mode, l.OnRedisError = set.Algorithm, r.Burst, set.Queue, set.MaxDelay, set.Mode, set.OnRedisError
	l.Charge, l.BlockFor = set.Charge, set.BlockFor
	return l
}

// window reads a limit's window into l: a unit, times unit_multiplier
// (1 when left out), as Envoy's RateLimit API writes one; or a window
// duration, which l then gives as the longest unit that divides it (90s
// is 90 seconds, 5m 5 minutes), so that the answer's current_limit, which
// Envoy reads in units, states it exactly.
func (v *validator) window(r *rawRateLimit, path string, l *RateLimit) {
	unitChoices := strings.Join(unitNames, ", ")
	if r.Window != "" {
		for _, f := range []struct {
			name string
			set  bool
		}{{"unit", r.Unit != ""}, {"unit_multiplier", r.UnitMultiplier != nil}} {
			if f.set {
				v.errs.Add(path+"."+f.name, "give unit (with unit_multiplier) or window, not both")
			}
		}
		if r.Unit != "" || r.UnitMultiplier != nil {
			return
		}
		w, err := time.ParseDuration(r.Window)
		switch {
		case err != nil:
			v.errs.Add(path+".window", "%q is not a duration (like 30s, 5m, 2h)", r.Window)
		case config.WindowProblem(w) != "":
			v.errs.Add(path+".window", "%q %s", r.Window, config.WindowProblem(w))
		case w%time.Second != 0:
			v.errs.Add(path+".window", "%q is not a whole number of seconds: the answer's current_limit gives the window in Envoy's units, of a second at least", r.Window)
		default:
			l.Window = w
			for i := len(unitNames) - 1; i >= 0; i-- {
				if u := Units[unitNames[i]]; w%u == 0 {
					l.Unit, l.UnitMultiplier = unitNames[i], int64(w/u)
					break
				}
			}
		}
		return
	}
	l.Unit = strings.ToLower(r.Unit)
	u, ok := Units[l.Unit]
	switch {
	case r.Unit == "":
		v.errs.Add(path+".unit", "is required (or a window); choices are %s", unitChoices)
	case !ok:
		v.errs.Add(path+".unit", "%q is not a unit; choices are %s", r.Unit, unitChoices)
	}
	l.UnitMultiplier = 1
	if m := r.UnitMultiplier; m != nil {
		if *m < 1 {
			v.errs.Add(path+".unit_multiplier", "%d must be at least 1", *m)
			return
		}
		if ok {
			// Saturated rather than overflowed: any window past the
			// longest is refused alike.
			w := time.Duration(math.MaxInt64)
			if *m <= int64(math.MaxInt64/u) {
				w = time.Duration(*m) * u
			}
			if problem := config.WindowProblem(w); problem != "" {
				v.errs.Add(path+".unit_multiplier", "%d × %s %s", *m, l.Unit, problem)
				return
			}
		}
		l.UnitMultiplier = *m
	}
	if ok {
		l.Window = time.Duration(l.UnitMultiplier) * u
	}
}

// FormatWindow writes a window in its longest whole unit of s, m, h or d
// (30s, 5m, 1d, 30d): what names the limits of a descriptor with several.
func FormatWindow(w time.Duration) string {
	for _, u := range []struct {
		d    time.Duration
		name string
	}{{24 * time.Hour, "d"}, {time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}} {
		if w >= u.d && w%u.d == 0 {
			return strconv.FormatInt(int64(w/u.d), 10) + u.name
		}
	}
	return w.String()
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
		{"unit", r.Unit != ""}, {"unit_multiplier", r.UnitMultiplier != nil}, {"window", r.Window != ""},
		{"requests_per_unit", r.RequestsPerUnit != nil}, {"unlimited", r.Unlimited},
		{"algorithm", r.Algorithm != ""}, {"mode", r.Mode != ""}, {"on_redis_error", r.OnRedisError != ""},
		{"burst", r.Burst != 0}, {"queue", r.Queue != nil}, {"max_delay", r.MaxDelay != ""}, {"charge", r.Charge != ""},
		{"block_for", r.BlockFor != ""},
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
		l.BlockFor = p.BlockFor
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
