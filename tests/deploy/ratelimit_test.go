package deploy

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3http "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// Envoy's global rate limiting with extauthz as its rate limit service:
// the ratelimit filter, in a bootstrap under envoy/ or patched in by an
// Istio EnvoyFilter, and the descriptor files extauthz reads
// (envoyproxy/ratelimit's format). `extauthz validate` checks the files
// themselves; these checks tie them to Envoy's side: the filter names a
// domain some file defines, calls where extauthz listens, and every
// rate_limits entry builds a descriptor that domain describes.

const rateLimitFilter = "envoy.filters.http.ratelimit"

// rlDomain is the part of a descriptor file these checks read.
type rlDomain struct {
	Domain      string         `json:"domain"`
	Descriptors []rlDescriptor `json:"descriptors"`
}

type rlDescriptor struct {
	Key         string         `json:"key"`
	Value       string         `json:"value"`
	RateLimit   map[string]any `json:"rate_limit"`
	Descriptors []rlDescriptor `json:"descriptors"`
}

// loadDomains reads the descriptor files the config's rls.domains names
// from files (by base name: the files beside the config).
func (c *sidecarConfig) loadDomains(files map[string][]byte) error {
	c.domains = map[string]*rlDomain{}
	for _, d := range c.RLS.Domains {
		data, ok := files[filepath.Base(d)]
		if !ok || filepath.Base(d) != d {
			return fmt.Errorf("rls.domains names %q, which is not a file beside the config", d)
		}
		var dom rlDomain
		if err := yaml.Unmarshal(data, &dom); err != nil {
			return fmt.Errorf("%s: %w", d, err)
		}
		c.domains[dom.Domain] = &dom
	}
	return nil
}

// checkRateLimitFilter checks a ratelimit filter against the extauthz
// config it calls, and returns the cluster it calls (or "").
// explicitFailureMode says whether its YAML states failure_mode_deny.
func checkRateLimitFilter(p *problems, where string, rl *ratelimitv3.RateLimit, sc *sidecarConfig, explicitFailureMode bool) string {
	if rl.GetDomain() == "" {
		p.add("%s: ratelimit filter names no domain", where)
	} else if sc != nil && sc.domains[rl.GetDomain()] == nil {
		p.add("%s: ratelimit filter domain %q is defined by no descriptor file of the extauthz config (rls.domains %v): every request would be allowed", where, rl.GetDomain(), sc.RLS.Domains)
	}
	if !explicitFailureMode {
		p.add("%s: ratelimit filter must state failure_mode_deny explicitly, with the reason", where)
	}
	timeout := rl.GetTimeout().AsDuration()
	if rl.GetTimeout() == nil || timeout <= 0 || timeout > maxCheckTimeout {
		p.add("%s: ratelimit filter timeout is %v, want set and at most %v (Envoy's default, 20ms, is sized for a remote service)", where, timeout, maxCheckTimeout)
	}
	if sc != nil && sc.rlsUsesRedis() && timeout <= breakerVerdict {
		p.add("%s: ratelimit filter timeout %v leaves extauthz no time to tell a frozen Redis (%v) and answer from its fallback", where, timeout, breakerVerdict)
	}
	svc := rl.GetRateLimitService()
	if svc.GetTransportApiVersion() != corev3.ApiVersion_V3 {
		p.add("%s: rate_limit_service transport_api_version is %s, want V3", where, svc.GetTransportApiVersion())
	}
	cluster := svc.GetGrpcService().GetEnvoyGrpc().GetClusterName()
	if cluster == "" {
		p.add("%s: rate_limit_service must use envoy_grpc with a cluster_name", where)
	}
	return cluster
}

// rlsUsesRedis reports whether the config counts in Redis: the rate
// limits take the default mode unless their file says otherwise.
func (c *sidecarConfig) rlsUsesRedis() bool {
	if c.Redis == nil {
		return false
	}
	return c.DefaultMode != "local"
}

// descriptorEntry is what one rate limit action puts in a descriptor: its
// key, and its value when the configuration fixes it ("" when the request
// supplies it).
type descriptorEntry struct{ key, value string }

// entriesOf returns the entries a rate_limits entry's actions build, in
// order, or an error for an action these checks cannot follow.
func entriesOf(rl *routev3.RateLimit) ([]descriptorEntry, error) {
	var out []descriptorEntry
	for i, a := range rl.GetActions() {
		var e descriptorEntry
		switch {
		case a.GetRemoteAddress() != nil:
			e.key = "remote_address"
		case a.GetSourceCluster() != nil:
			e.key = "source_cluster"
		case a.GetDestinationCluster() != nil:
			e.key = "destination_cluster"
		case a.GetRequestHeaders() != nil:
			e.key = a.GetRequestHeaders().GetDescriptorKey()
		case a.GetGenericKey() != nil:
			e = descriptorEntry{a.GetGenericKey().GetDescriptorKey(), a.GetGenericKey().GetDescriptorValue()}
			if e.key == "" {
				e.key = "generic_key"
			}
		case a.GetHeaderValueMatch() != nil:
			e = descriptorEntry{a.GetHeaderValueMatch().GetDescriptorKey(), a.GetHeaderValueMatch().GetDescriptorValue()}
			if e.key == "" {
				e.key = "header_match"
			}
		case a.GetMetadata() != nil:
			e.key = a.GetMetadata().GetDescriptorKey()
		default:
			return nil, fmt.Errorf("actions[%d]: an action these checks cannot follow; add it to entriesOf", i)
		}
		out = append(out, e)
	}
	return out, nil
}

// describes reports whether some descriptor path of dom, as deep as
// entries, ends in a rate limit (or an unlimited one) that a descriptor of
// these entries can reach: per level, a descriptor with the entry's key
// and its fixed value (or a wildcard matching it, or no value), any value
// when the request supplies it.
func describes(ds []rlDescriptor, entries []descriptorEntry) bool {
	if len(entries) == 0 {
		return false
	}
	e := entries[0]
	for _, d := range ds {
		if d.Key != e.key || !valueCanMatch(d.Value, e.value) {
			continue
		}
		if len(entries) == 1 {
			if d.RateLimit != nil {
				return true
			}
			continue
		}
		if describes(d.Descriptors, entries[1:]) {
			return true
		}
	}
	return false
}

// valueCanMatch reports whether a descriptor's value can match an entry
// whose value is fixed to v ("": any value the request brings).
func valueCanMatch(pattern, v string) bool {
	if pattern == "" || v == "" {
		return true
	}
	if !strings.Contains(pattern, "*") {
		return pattern == v
	}
	parts := strings.Split(pattern, "*")
	if !strings.HasPrefix(v, parts[0]) || !strings.HasSuffix(v, parts[len(parts)-1]) || len(v) < len(parts[0])+len(parts[len(parts)-1]) {
		return false
	}
	rest := v[len(parts[0]) : len(v)-len(parts[len(parts)-1])]
	for _, part := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, part)
		if i < 0 {
			return false
		}
		rest = rest[i+len(part):]
	}
	return true
}

// checkRateLimits checks a route's (or virtual host's) rate_limits against
// the domain the filter names: each builds a descriptor some rate limit
// of the domain applies to.
func checkRateLimits(p *problems, where string, rls []*routev3.RateLimit, dom *rlDomain) {
	for i, rl := range rls {
		entries, err := entriesOf(rl)
		if err != nil {
			p.add("%s: rate_limits[%d]: %v", where, i, err)
			continue
		}
		if dom != nil && !describes(dom.Descriptors, entries) {
			p.add("%s: rate_limits[%d] sends descriptor %v, which no rate limit of domain %s describes: it would never be limited", where, i, entries, dom.Domain)
		}
	}
}

// rateLimitFilterOf returns the ratelimit filter of an HTTP filter chain
// and its index (-1 when none).
func rateLimitFilterOf(filters []*hcmv3http.HttpFilter) (*ratelimitv3.RateLimit, int) {
	for i, f := range filters {
		if rl, ok := unpack[*ratelimitv3.RateLimit](f.GetTypedConfig()); ok {
			return rl, i
		}
	}
	return nil, -1
}

// checkRateLimitBootstrap checks a bootstrap's ratelimit filter, the
// cluster it calls and the routes' rate_limits (their own, and those of
// the filter's per-route config, the only ones whose hits_addend Envoy
// reads). It returns how many of them charge when the stream is done.
func checkRateLimitBootstrap(p *problems, name string, raw []byte, b *bootstrapv3.Bootstrap, h *hcmv3http.HttpConnectionManager, rl *ratelimitv3.RateLimit, sc *sidecarConfig) int {
	explicit, err := explicitField(raw, "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit", "failure_mode_deny")
	if err != nil {
		p.add("%s: %v", name, err)
		return 0
	}
	cluster := checkRateLimitFilter(p, name, rl, sc, len(explicit) > 0 && explicit[0])
	if cluster != "" {
		checkExtAuthzCluster(p, name, b, cluster, sc)
	}
	dom := sc.domains[rl.GetDomain()]
	limited, charges := 0, 0
	for _, vh := range h.GetRouteConfig().GetVirtualHosts() {
		checkRateLimits(p, fmt.Sprintf("%s: virtual host %q", name, vh.GetName()), vh.GetRateLimits(), dom)
		limited += len(vh.GetRateLimits())
		for _, r := range vh.GetRoutes() {
			rls := r.GetRoute().GetRateLimits()
			if per, ok := unpack[*ratelimitv3.RateLimitPerRoute](r.GetTypedPerFilterConfig()[rateLimitFilter]); ok {
				rls = append(rls, per.GetRateLimits()...)
			}
			if strings.Contains(routePath(r), "health") && len(rls)+len(vh.GetRateLimits()) > 0 {
				p.add("%s: health-check route %q has rate_limits: probes would spend quota", name, r.GetName())
			}
			where := fmt.Sprintf("%s: route %q", name, r.GetName())
			checkRateLimits(p, where, rls, dom)
			charges += checkCharges(p, where, rls, dom, sc)
			limited += len(rls)
		}
	}
	if limited == 0 {
		p.add("%s: the ratelimit filter runs, but no route has rate_limits: it never calls extauthz", name)
	}
	return charges
}

// checkCharges checks the rate_limits that charge when the stream is done
// (apply_on_stream_done): each takes its hits from the response
// (hits_addend), and its descriptor reaches a limit that never refuses a
// charge (charge: always, its own or its policy's), since Envoy ignores
// the answer: a refused charge would be lost. It returns how many there
// are.
func checkCharges(p *problems, where string, rls []*routev3.RateLimit, dom *rlDomain, sc *sidecarConfig) int {
	n := 0
	for i, rl := range rls {
		if !rl.GetApplyOnStreamDone() {
			continue
		}
		n++
		if rl.GetHitsAddend().GetFormat() == "" && rl.GetHitsAddend().GetNumber() == nil {
			p.add("%s: rate_limits[%d] applies on stream done without a hits_addend: it charges one per response, not what the response reported", where, i)
		}
		entries, err := entriesOf(rl)
		if err != nil || dom == nil {
			continue
		}
		if !chargesAlways(dom.Descriptors, entries, sc) {
			p.add("%s: rate_limits[%d] charges on stream done a descriptor %v whose rate limit is not charge: always (its own or its policy's): a charge past the limit would be refused, and lost", where, i, entries)
		}
	}
	return n
}

// chargesAlways reports whether the rate limit the entries reach (as
// describes finds it) is charge: always, or counts in a policy that is.
func chargesAlways(ds []rlDescriptor, entries []descriptorEntry, sc *sidecarConfig) bool {
	e := entries[0]
	for _, d := range ds {
		if d.Key != e.key || !valueCanMatch(d.Value, e.value) {
			continue
		}
		if len(entries) > 1 {
			if chargesAlways(d.Descriptors, entries[1:], sc) {
				return true
			}
			continue
		}
		if d.RateLimit == nil {
			continue
		}
		if d.RateLimit["charge"] == "always" {
			return true
		}
		if name, _ := d.RateLimit["policy"].(string); name != "" {
			for _, pol := range sc.Policies {
				if pol.Name == name && pol.Charge == "always" {
					return true
				}
			}
		}
	}
	return false
}

// explicitField reports, for each typed_config of type typeURL in the
// YAML, whether it states field. proto3 cannot tell false from absent.
func explicitField(raw []byte, typeURL, field string) ([]bool, error) {
	js, err := strictJSON(raw)
	if err != nil {
		return nil, err
	}
	var doc any
	if err := json.Unmarshal(js, &doc); err != nil {
		return nil, err
	}
	var out []bool
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if v["@type"] == typeURL {
				_, ok := v[field]
				out = append(out, ok)
			}
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(doc)
	return out, nil
}

// checkEnvoyFilter checks an Istio EnvoyFilter that adds the ratelimit
// filter or rate_limits: its patches decode into Envoy's API and pass its
// validation; the filter calls, through a Service of the apply set, an
// extauthz that defines its domain; the rate_limits build descriptors
// that domain describes; the workload selector selects a Deployment.
func checkEnvoyFilter(p *problems, s *set, o *object, ef *networkingv1alpha3.EnvoyFilter) {
	labels := ef.GetWorkloadSelector().GetLabels()
	selected := false
	for _, pod := range s.pods {
		if selects(labels, pod.labels) {
			selected = true
		}
	}
	if !selected {
		p.add("%s: workloadSelector %v matches no Deployment in apply set %s", o, labels, s.name)
	}
	for i, cp := range ef.GetConfigPatches() {
		where := fmt.Sprintf("%s: configPatches[%d]", o, i)
		js, err := protojson.Marshal(cp.GetPatch().GetValue())
		if err != nil {
			p.add("%s: %v", where, err)
			continue
		}
		switch cp.GetApplyTo() {
		case networkingv1alpha3.EnvoyFilter_HTTP_FILTER:
			var f hcmv3http.HttpFilter
			if err := protojson.Unmarshal(js, &f); err != nil {
				p.add("%s: patch value is not an HttpFilter: %v", where, err)
				continue
			}
			if err := validateDeep(&f); err != nil {
				p.add("%s: %v", where, err)
				continue
			}
			rl, ok := unpack[*ratelimitv3.RateLimit](f.GetTypedConfig())
			if !ok {
				continue
			}
			if f.GetName() != rateLimitFilter {
				p.add("%s: the ratelimit filter is named %q, want %s", where, f.GetName(), rateLimitFilter)
			}
			_, explicit := cp.GetPatch().GetValue().GetFields()["typed_config"].GetStructValue().GetFields()["failure_mode_deny"]
			sc := s.rateLimitService(p, where, rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName())
			checkRateLimitFilter(p, where, rl, sc, explicit)
			if sc != nil {
				s.rlDomain = sc.domains[rl.GetDomain()]
			}
		case networkingv1alpha3.EnvoyFilter_VIRTUAL_HOST, networkingv1alpha3.EnvoyFilter_HTTP_ROUTE:
			// A partial virtual host or route (its required fields are
			// Istio's): only its rate_limits are read, each validated on
			// its own.
			var found []*routev3.RateLimit
			if cp.GetApplyTo() == networkingv1alpha3.EnvoyFilter_VIRTUAL_HOST {
				var vh routev3.VirtualHost
				err = protojson.Unmarshal(js, &vh)
				found = vh.GetRateLimits()
			} else {
				var r routev3.Route
				err = protojson.Unmarshal(js, &r)
				found = r.GetRoute().GetRateLimits()
			}
			if err != nil {
				p.add("%s: %v", where, err)
				continue
			}
			if len(found) == 0 {
				p.add("%s: patches no rate_limits", where)
			}
			var rls []*routev3.RateLimit
			for j, rl := range found {
				if err := rl.ValidateAll(); err != nil {
					p.add("%s: rate_limits[%d]: %v", where, j, err)
					continue
				}
				rls = append(rls, rl)
			}
			s.rlPending = append(s.rlPending, pendingRateLimits{where, rls})
		}
	}
}

// pendingRateLimits are rate_limits found in an EnvoyFilter, checked once
// every EnvoyFilter of the set has named the filter's domain.
type pendingRateLimits struct {
	where string
	rls   []*routev3.RateLimit
}

// checkPendingRateLimits checks the set's EnvoyFilter rate_limits against
// the domain its ratelimit filter names.
func checkPendingRateLimits(p *problems, s *set) {
	for _, pr := range s.rlPending {
		if s.rlDomain == nil {
			p.add("%s: rate_limits, but no EnvoyFilter of apply set %s adds a ratelimit filter whose domain extauthz defines", pr.where, s.name)
			continue
		}
		checkRateLimits(p, pr.where, pr.rls, s.rlDomain)
	}
}

// rateLimitService follows Istio's cluster name for a Service port,
// outbound|PORT||HOST, to the extauthz behind it and returns its config.
func (s *set) rateLimitService(p *problems, where, cluster string) *sidecarConfig {
	parts := strings.Split(cluster, "|")
	if len(parts) != 4 || parts[0] != "outbound" {
		p.add("%s: rate_limit_service cluster %q is not Istio's outbound|PORT||HOST name of a Service", where, cluster)
		return nil
	}
	svcName, ns, _ := strings.Cut(strings.TrimSuffix(parts[3], ".svc.cluster.local"), ".")
	so := s.find("Service", svcName)
	if so == nil || so.meta.Namespace != ns {
		p.add("%s: rate_limit_service calls %s, but apply set %s has no Service %s in namespace %s", where, parts[3], s.name, svcName, ns)
		return nil
	}
	svc := so.k8s.(*corev1.Service)
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if fmt.Sprint(svc.Spec.Ports[i].Port) == parts[1] {
			sp = &svc.Spec.Ports[i]
		}
	}
	if sp == nil {
		p.add("%s: Service %s has no port %s", where, svcName, parts[1])
		return nil
	}
	if sp.AppProtocol == nil || *sp.AppProtocol != "grpc" {
		p.add("%s: Service %s port %s needs appProtocol: grpc so the mesh speaks HTTP/2 to it", where, svcName, parts[1])
	}
	for _, pod := range s.pods {
		if selects(svc.Spec.Selector, pod.labels) && pod.extauthz != nil {
			return pod.extauthz
		}
	}
	p.add("%s: Service %s selects no extauthz", where, svcName)
	return nil
}
