package rlsxds

import (
	"strings"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"

	"github.com/extauthz/extauthz/internal/rlsconfig"
)

// Set is one update's resources: every RateLimitConfig the server sent
// (SotW: the whole state), as descriptor configurations.
type Set struct {
	Version string
	sources []rlsconfig.Source
}

// Load checks the set under the main configuration's options, as files
// are checked: the same language, the same errors, each prefixed with
// xds:<resource name>.
func (s *Set) Load(o rlsconfig.Options) (*rlsconfig.Config, error) {
	if s == nil || len(s.sources) == 0 {
		return nil, nil
	}
	return rlsconfig.LoadSources(s.sources, o)
}

// newSet converts the resources into descriptor configurations.
func newSet(version string, cfgs []*rlsconfv3.RateLimitConfig) (*Set, error) {
	s := &Set{Version: version}
	for _, c := range cfgs {
		data, err := yaml.Marshal(configYAML(c))
		if err != nil {
			return nil, err
		}
		s.sources = append(s.sources, rlsconfig.Source{Name: "xds:" + c.GetName(), Data: data})
	}
	return s, nil
}

// configYAML writes a RateLimitConfig in envoyproxy/ratelimit's file
// language, field for field (quota_mode included).
func configYAML(c *rlsconfv3.RateLimitConfig) map[string]any {
	return map[string]any{"domain": c.GetDomain(), "descriptors": descriptorsYAML(c.GetDescriptors())}
}

func descriptorsYAML(ds []*rlsconfv3.RateLimitDescriptor) []any {
	out := make([]any, 0, len(ds))
	for _, d := range ds {
		m := map[string]any{"key": d.GetKey()}
		if d.GetValue() != "" {
			m["value"] = d.GetValue()
		}
		if d.GetShadowMode() {
			m["shadow_mode"] = true
		}
		if d.GetQuotaMode() {
			m["quota_mode"] = true
		}
		if d.GetDetailedMetric() {
			m["detailed_metric"] = true
		}
		if rl := d.GetRateLimit(); rl != nil {
			r := map[string]any{}
			if rl.GetUnlimited() {
				r["unlimited"] = true
			} else {
				r["unit"] = strings.ToLower(rl.GetUnit().String())
				r["requests_per_unit"] = rl.GetRequestsPerUnit()
			}
			if rl.GetName() != "" {
				r["name"] = rl.GetName()
			}
			if len(rl.GetReplaces()) > 0 {
				reps := make([]any, 0, len(rl.GetReplaces()))
				for _, rep := range rl.GetReplaces() {
					reps = append(reps, map[string]any{"name": rep.GetName()})
				}
				r["replaces"] = reps
			}
			m["rate_limit"] = r
		}
		if len(d.GetDescriptors()) > 0 {
			m["descriptors"] = descriptorsYAML(d.GetDescriptors())
		}
		out = append(out, m)
	}
	return out
}
