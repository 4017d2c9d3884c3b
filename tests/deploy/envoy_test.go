package deploy

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	streamv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	jwtauthnv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	fixedheapv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/resource_monitors/fixed_heap/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	// Every extension a shipped bootstrap names in a typed_config. protojson
	// resolves "@type" against the types linked in, so a missing import
	// fails loudly ("unable to resolve"), never silently.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/resource_monitors/downstream_connections/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/resource_monitors/fixed_heap/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
)

// Names Envoy knows the extensions by.
const (
	extAuthzFilter = "envoy.filters.http.ext_authz"
	jwtAuthnFilter = "envoy.filters.http.jwt_authn"
	httpOptionsKey = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
	// extAuthzCluster is the ext_authz cluster's name in every bootstrap:
	// the circuit breaker alert and panel select it by name.
	extAuthzCluster = "extauthz"
	// maxCheckTimeout is the ext_authz budget: SPEC §4 sizes Redis calls
	// to fit inside Envoy's 200ms.
	maxCheckTimeout = 200 * time.Millisecond
	// checksInFlight is the concurrency docs/deploying.md ("Concurrency")
	// sizes the ext_authz cluster's circuit breaker for: 5,000 requests a
	// second, each Check taking the whole 0.2s timeout.
	checksInFlight = 1000
	// statsPath is the one admin path a bootstrap may expose beyond
	// loopback, for Prometheus.
	statsPath = "/stats/prometheus"
)

// loadBootstrap decodes an Envoy bootstrap from YAML the way Envoy does:
// strictly (an unknown field fails), every typed_config resolved to its
// message, and every message, including those inside Anys, passed through
// the generated ValidateAll.
func loadBootstrap(data []byte) (*bootstrapv3.Bootstrap, error) {
	js, err := strictJSON(data)
	if err != nil {
		return nil, err
	}
	b := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(js, b); err != nil {
		return nil, err
	}
	if err := validateDeep(b); err != nil {
		return nil, err
	}
	return b, nil
}

// validateDeep runs ValidateAll on m and on every message packed in an Any
// below it; PGV's ValidateAll stops at Any fields.
func validateDeep(m proto.Message) error {
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			return fmt.Errorf("%s: %w", m.ProtoReflect().Descriptor().FullName(), err)
		}
	}
	var err error
	walkAnys(m.ProtoReflect(), func(a *anypb.Any) bool {
		inner, uerr := a.UnmarshalNew()
		if uerr != nil {
			err = fmt.Errorf("%s: %w", a.GetTypeUrl(), uerr)
			return false
		}
		if verr := validateDeep(inner); verr != nil {
			err = verr
			return false
		}
		return true
	})
	return err
}

// walkAnys calls fn for each Any directly reachable from m (not inside
// another Any) until fn returns false.
func walkAnys(m protoreflect.Message, fn func(*anypb.Any) bool) bool {
	if a, ok := m.Interface().(*anypb.Any); ok {
		return fn(a)
	}
	cont := true
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					cont = walkAnys(mv.Message(), fn)
					return cont
				})
			}
		case fd.IsList():
			if fd.Message() != nil {
				l := v.List()
				for i := 0; i < l.Len() && cont; i++ {
					cont = walkAnys(l.Get(i).Message(), fn)
				}
			}
		case fd.Message() != nil:
			cont = walkAnys(v.Message(), fn)
		}
		return cont
	})
	return cont
}

// unpack decodes an Any into a new T.
func unpack[T proto.Message](a *anypb.Any) (T, bool) {
	var zero T
	if a == nil {
		return zero, false
	}
	m, err := a.UnmarshalNew()
	if err != nil {
		return zero, false
	}
	t, ok := m.(T)
	return t, ok
}

// hcms returns every HTTP connection manager in b's static listeners.
func hcms(b *bootstrapv3.Bootstrap) []*hcmv3.HttpConnectionManager {
	var out []*hcmv3.HttpConnectionManager
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				if h, ok := unpack[*hcmv3.HttpConnectionManager](f.GetTypedConfig()); ok {
					out = append(out, h)
				}
			}
		}
	}
	return out
}

func clusterByName(b *bootstrapv3.Bootstrap, name string) *clusterv3.Cluster {
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() == name {
			return c
		}
	}
	return nil
}

// socketAddresses returns the TCP endpoints of a static cluster.
func socketAddresses(c *clusterv3.Cluster) []*corev3.SocketAddress {
	var out []*corev3.SocketAddress
	for _, le := range c.GetLoadAssignment().GetEndpoints() {
		for _, lb := range le.GetLbEndpoints() {
			if sa := lb.GetEndpoint().GetAddress().GetSocketAddress(); sa != nil {
				out = append(out, sa)
			}
		}
	}
	return out
}

func pipePaths(c *clusterv3.Cluster) []string {
	var out []string
	for _, le := range c.GetLoadAssignment().GetEndpoints() {
		for _, lb := range le.GetLbEndpoints() {
			if p := lb.GetEndpoint().GetAddress().GetPipe(); p != nil {
				out = append(out, p.GetPath())
			}
		}
	}
	return out
}

// checkBootstrap checks an Envoy bootstrap against the extauthz config it
// is deployed with. raw is its YAML, for settings proto3 cannot tell from
// their defaults.
func checkBootstrap(p *problems, name string, raw []byte, b *bootstrapv3.Bootstrap, sc *sidecarConfig) {
	if a := b.GetAdmin().GetAddress().GetSocketAddress(); a != nil {
		if ip := net.ParseIP(a.GetAddress()); ip == nil || !ip.IsLoopback() {
			p.add("%s: admin listens on %s: the admin API must stay on loopback", name, a.GetAddress())
		}
	}
	checkOverload(p, name, b)
	for _, l := range b.GetStaticResources().GetListeners() {
		if l.GetPerConnectionBufferLimitBytes() == nil {
			p.add("%s: listener %s: set per_connection_buffer_limit_bytes (the 1 MiB default lets each client make Envoy buffer that much)", name, l.GetName())
		}
	}
	var managers []*hcmv3.HttpConnectionManager
	for _, h := range hcms(b) {
		if isStatsHCM(b, h) {
			checkStatsHCM(p, name, b, h)
			continue
		}
		managers = append(managers, h)
	}
	if len(managers) == 0 {
		p.add("%s: no http_connection_manager", name)
		return
	}
	explicit, err := explicitFailureMode(raw)
	if err != nil {
		p.add("%s: %v", name, err)
		return
	}
	for _, h := range managers {
		checkHCM(p, name, raw, b, h, sc, explicit)
		checkRequestID(p, name, h)
	}
}

// adminCluster returns the static cluster that reaches Envoy's own admin
// listener, if any.
func adminCluster(b *bootstrapv3.Bootstrap) *clusterv3.Cluster {
	admin := b.GetAdmin().GetAddress().GetSocketAddress()
	for _, c := range b.GetStaticResources().GetClusters() {
		for _, sa := range socketAddresses(c) {
			if admin != nil && sa.GetAddress() == admin.GetAddress() && sa.GetPortValue() == admin.GetPortValue() {
				return c
			}
		}
	}
	return nil
}

// isStatsHCM reports whether h routes to the admin cluster: the listener
// that serves Envoy's metrics to Prometheus.
func isStatsHCM(b *bootstrapv3.Bootstrap, h *hcmv3.HttpConnectionManager) bool {
	admin := adminCluster(b)
	if admin == nil {
		return false
	}
	for _, vh := range h.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			if r.GetRoute().GetCluster() == admin.GetName() {
				return true
			}
		}
	}
	return false
}

// checkStatsHCM checks the metrics listener exposes exactly statsPath of
// the admin API: the rest of it can stop Envoy or change its state.
func checkStatsHCM(p *problems, name string, b *bootstrapv3.Bootstrap, h *hcmv3.HttpConnectionManager) {
	for _, vh := range h.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			if r.GetMatch().GetPath() != statsPath {
				p.add("%s: the admin API is reachable beyond loopback through a route matching %q; expose only path %s", name, routePath(r), statsPath)
			}
		}
	}
}

// checkRequestID checks the access log prints the x-request-id Envoy gives
// each request, which extauthz's decision log and spans carry too.
func checkRequestID(p *problems, name string, h *hcmv3.HttpConnectionManager) {
	if !h.GetGenerateRequestId().GetValue() && h.GetGenerateRequestId() != nil {
		p.add("%s: generate_request_id is off: requests reach extauthz without an x-request-id", name)
	}
	logs := h.GetAccessLog()
	if len(logs) == 0 {
		p.add("%s: no access log: a 503 or 429 cannot be followed from Envoy to extauthz", name)
	}
	for _, al := range logs {
		sl, ok := unpack[*streamv3.StdoutAccessLog](al.GetTypedConfig())
		if !ok {
			continue
		}
		format, _ := protojson.Marshal(sl.GetLogFormat())
		if !strings.Contains(strings.ToUpper(string(format)), "%REQ(X-REQUEST-ID)%") {
			p.add("%s: access log %s does not print %%REQ(X-REQUEST-ID)%%, the id extauthz's decision log and spans carry", name, al.GetName())
		}
	}
}

// checkOverload checks the edge protections of Envoy's best practices: a
// heap monitor that makes Envoy shrink its heap, then refuse new requests,
// before the container's memory limit is reached.
func checkOverload(p *problems, name string, b *bootstrapv3.Bootstrap) {
	om := b.GetOverloadManager()
	const heap = "envoy.resource_monitors.fixed_heap"
	if fixedHeapBytes(b) == 0 {
		p.add("%s: overload_manager has no %s monitor with max_heap_size_bytes", name, heap)
	}
	for _, action := range []string{"envoy.overload_actions.shrink_heap", "envoy.overload_actions.stop_accepting_requests"} {
		found := false
		for _, a := range om.GetActions() {
			for _, tr := range a.GetTriggers() {
				if a.GetName() == action && tr.GetName() == heap && tr.GetThreshold().GetValue() > 0 && tr.GetThreshold().GetValue() < 1 {
					found = true
				}
			}
		}
		if !found {
			p.add("%s: overload_manager has no %s action triggered by %s", name, action, heap)
		}
	}
}

// fixedHeapBytes returns the fixed_heap monitor's max_heap_size_bytes, 0
// when there is none.
func fixedHeapBytes(b *bootstrapv3.Bootstrap) uint64 {
	for _, m := range b.GetOverloadManager().GetResourceMonitors() {
		if fh, ok := unpack[*fixedheapv3.FixedHeapConfig](m.GetTypedConfig()); ok && m.GetName() == "envoy.resource_monitors.fixed_heap" {
			return fh.GetMaxHeapSizeBytes()
		}
	}
	return 0
}

// explicitFailureMode reports, for each ext_authz typed_config in the YAML,
// whether it states failure_mode_allow. proto3 cannot tell false from
// absent, and this choice must be made on purpose.
func explicitFailureMode(raw []byte) ([]bool, error) {
	return explicitField(raw, "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz", "failure_mode_allow")
}

func checkHCM(p *problems, name string, raw []byte, b *bootstrapv3.Bootstrap, h *hcmv3.HttpConnectionManager, sc *sidecarConfig, explicit []bool) {
	filters := h.GetHttpFilters()
	if len(filters) == 0 {
		p.add("%s: http_connection_manager has no http_filters", name)
		return
	}
	if _, ok := unpack[*routerv3.Router](filters[len(filters)-1].GetTypedConfig()); !ok {
		p.add("%s: the last http filter is %s, want the router", name, filters[len(filters)-1].GetName())
	}
	if q := rlqsFilterOf(filters); q != nil {
		// Envoy enforces extauthz's quota assignments: no call per request.
		checkRLQSBootstrap(p, name, b, q, sc)
		return
	}
	if rl, _ := rateLimitFilterOf(filters); rl != nil {
		// Global rate limiting: the ratelimit filter calls extauthz's
		// rate limit service, and ext_authz is not in the chain; but for
		// token budgets, where Check admits and the ratelimit filter
		// only charges when the stream is done (then both are checked).
		both := false
		for _, f := range filters {
			if _, ok := unpack[*extauthzv3.ExtAuthz](f.GetTypedConfig()); ok {
				both = true
			}
		}
		charges := checkRateLimitBootstrap(p, name, raw, b, h, rl, sc)
		switch {
		case !both:
			return
		case charges == 0:
			p.add("%s: both ext_authz and the ratelimit filter call extauthz: one door per bootstrap keeps its checks meaningful (but for token budgets: the ratelimit filter charging with apply_on_stream_done)", name)
			return
		}
	}
	var ea *extauthzv3.ExtAuthz
	var jwt *jwtauthnv3.JwtAuthentication
	eaIndex, jwtIndex := -1, -1
	names := map[string]bool{}
	for i, f := range filters {
		names[f.GetName()] = true
		if x, ok := unpack[*extauthzv3.ExtAuthz](f.GetTypedConfig()); ok {
			if ea != nil {
				p.add("%s: more than one ext_authz filter", name)
			}
			ea, eaIndex = x, i
			if f.GetName() != extAuthzFilter {
				// Its dynamic metadata and per-route configs go by this name.
				p.add("%s: ext_authz filter is named %q, want %s", name, f.GetName(), extAuthzFilter)
			}
		}
		if x, ok := unpack[*jwtauthnv3.JwtAuthentication](f.GetTypedConfig()); ok {
			jwt, jwtIndex = x, i
		}
	}
	if ea == nil {
		p.add("%s: no ext_authz filter", name)
		return
	}
	if len(explicit) == 0 || !explicit[0] {
		p.add("%s: ext_authz must state failure_mode_allow explicitly, with the reason", name)
	}

	if ea.GetTransportApiVersion() != corev3.ApiVersion_V3 {
		p.add("%s: ext_authz transport_api_version is %s, want V3", name, ea.GetTransportApiVersion())
	}
	if ea.GetWithRequestBody() != nil {
		p.add("%s: ext_authz with_request_body is set: extauthz decides on headers; buffering bodies only adds latency", name)
	}
	if s := ea.GetStatusOnError().GetCode(); s < 500 || s > 599 {
		p.add("%s: ext_authz status_on_error is %d, want a 5xx (the default 403 blames the client)", name, s)
	}
	if hs := ea.GetHttpService(); hs != nil {
		checkHTTPService(p, name, b, ea, hs, sc)
		checkRoutes(p, name, b, h, sc, names)
		return
	}
	gs := ea.GetGrpcService()
	if gs == nil {
		p.add("%s: ext_authz has neither grpc_service nor http_service", name)
		return
	}
	timeout := gs.GetTimeout().AsDuration()
	if gs.GetTimeout() == nil || timeout <= 0 || timeout > maxCheckTimeout {
		p.add("%s: ext_authz grpc_service.timeout is %v, want set and at most %v", name, timeout, maxCheckTimeout)
	}
	if sc.usesRedis() && timeout <= breakerVerdict {
		p.add("%s: ext_authz timeout %v leaves extauthz no time to tell a frozen Redis (%v) and answer from its fallback", name, timeout, breakerVerdict)
	}
	if ea.GetStatPrefix() != "" {
		p.add("%s: ext_authz stat_prefix %q renames its counters; the alerts and dashboard read envoy_http_ext_authz_* (docs/alerts.md)", name, ea.GetStatPrefix())
	}
	clusterName := gs.GetEnvoyGrpc().GetClusterName()
	if clusterName == "" {
		p.add("%s: ext_authz grpc_service must use envoy_grpc with a cluster_name", name)
		return
	}
	if clusterName != extAuthzCluster {
		p.add("%s: the ext_authz cluster is %q; the alerts and dashboard read it as envoy_cluster_name=%q", name, clusterName, extAuthzCluster)
	}
	checkExtAuthzCluster(p, name, b, clusterName, sc)

	// jwt_authn in front: claims reach extauthz only through the metadata
	// context, and only if jwt_authn runs first and stores the payload.
	forwardsJWT := contains(ea.GetMetadataContextNamespaces(), jwtAuthnFilter)
	if jwt != nil {
		if jwtIndex > eaIndex {
			p.add("%s: jwt_authn runs after ext_authz: claims are not verified when extauthz decides", name)
		}
		if !forwardsJWT {
			p.add("%s: ext_authz metadata_context_namespaces lacks %s: claim keys would see nothing", name, jwtAuthnFilter)
		}
		for pname, prov := range jwt.GetProviders() {
			if prov.GetPayloadInMetadata() == "" {
				p.add("%s: jwt_authn provider %s has no payload_in_metadata: extauthz cannot read its claims", name, pname)
			}
			if len(prov.GetFromHeaders()) == 0 && (sc.Clients.Bearer == nil || *sc.Clients.Bearer) {
				p.add("%s: jwt_authn provider %s reads Authorization: Bearer, but the extauthz config does not set clients.bearer: false (every JWT would be taken for an unknown API key)", name, pname)
			}
		}
	}
	if sc.usesClaims() && (jwt == nil || !forwardsJWT) {
		p.add("%s: the extauthz config keys on JWT claims, but no jwt_authn filter feeds ext_authz", name)
	}

	checkRoutes(p, name, b, h, sc, names)
}

// Envoy's http_service and the HTTP door (internal/httpauth).
const (
	// envoyPathPrefix is where the door reads Envoy's convention
	// (httpauth.EnvoyPrefix): Envoy appends the original path to it.
	envoyPathPrefix = "/envoy"
	// probeTimeout is the breaker's probe (internal/quota/redisstore): a
	// call that timed out waits for it before the decision falls back.
	probeTimeout = 100 * time.Millisecond
	// maxHTTPCheckTimeout bounds http_service's timeout: past it, a stuck
	// sidecar holds requests too long.
	maxHTTPCheckTimeout = time.Second
)

// checkHTTPService checks an ext_authz http_service against the HTTP door
// of the paired config: where it listens, what Envoy must send it (Envoy
// sends an HTTP server only Host, :method, :path and Authorization unless
// allowed_headers says more) and what Envoy must pass on.
func checkHTTPService(p *problems, name string, b *bootstrapv3.Bootstrap, ea *extauthzv3.ExtAuthz, hs *extauthzv3.HttpService, sc *sidecarConfig) {
	if hs.GetPathPrefix() != envoyPathPrefix {
		p.add("%s: http_service.path_prefix is %q, want %s (the door reads Envoy's convention there)", name, hs.GetPathPrefix(), envoyPathPrefix)
	}
	if hs.GetPathOverride() != "" {
		p.add("%s: http_service.path_override hides the original path from the door", name)
	}
	// The door gets no deadline from Envoy: a call to a Redis that stopped
	// answering runs redis.timeout, then waits for the breaker's probe.
	timeout := hs.GetServerUri().GetTimeout().AsDuration()
	worst := sc.redisTimeout() + probeTimeout
	if timeout <= 0 || timeout > maxHTTPCheckTimeout {
		p.add("%s: http_service.server_uri.timeout is %v, want set and at most %v", name, timeout, maxHTTPCheckTimeout)
	} else if sc.usesRedis() && timeout <= worst {
		p.add("%s: http_service timeout %v leaves extauthz no time to call a Redis that stopped answering (%v) and answer from its fallback", name, timeout, worst)
	}
	if sc.Listen.HTTP == "" {
		p.add("%s: ext_authz uses http_service, but the extauthz config has no listen.http", name)
		return
	}
	listen, err := parseListen(sc.Listen.HTTP)
	if err != nil {
		p.add("%s: extauthz listen.http: %v", name, err)
		return
	}
	clusterName := hs.GetServerUri().GetCluster()
	c := clusterByName(b, clusterName)
	if c == nil {
		p.add("%s: http_service cluster %q is not defined", name, clusterName)
		return
	}
	if opts, ok := unpack[*httpv3.HttpProtocolOptions](c.GetTypedExtensionProtocolOptions()[httpOptionsKey]); ok && opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil {
		p.add("%s: cluster %s is HTTP/2; the HTTP door speaks HTTP/1.1", name, clusterName)
	}
	addrs := socketAddresses(c)
	if len(addrs)+len(pipePaths(c)) == 0 {
		p.add("%s: cluster %s has no endpoints", name, clusterName)
	}
	for _, sa := range addrs {
		if !listen.reaches(sa.GetAddress(), sa.GetPortValue()) {
			p.add("%s: cluster %s sends auth requests to %s:%d, but extauthz's HTTP door listens on %s", name, clusterName, sa.GetAddress(), sa.GetPortValue(), sc.Listen.HTTP)
		}
	}

	// What the door reads: the key header, and every header a key names.
	allowed := ea.GetAllowedHeaders()
	need := map[string]string{}
	if len(sc.Clients.Keys) > 0 {
		need[sc.keyHeader()] = "clients.header"
	}
	for _, pol := range sc.Policies {
		for _, k := range pol.Key {
			switch {
			case strings.HasPrefix(k, "header:"):
				need[strings.ToLower(strings.TrimPrefix(k, "header:"))] = "policy " + pol.Name
			case k == "ip" && sc.IPTrustedHops > 0:
				need["x-forwarded-for"] = "policy " + pol.Name + " (ip behind ip_trusted_hops)"
			case strings.HasPrefix(k, "claim:") || k == "principal":
				p.add("%s: policy %s keys on %s, which Envoy sends gRPC authorization servers only", name, pol.Name, k)
			}
		}
		if len(pol.Match.Context) > 0 {
			p.add("%s: policy %s matches context_extensions, which Envoy sends gRPC authorization servers only", name, pol.Name)
		}
	}
	for h, why := range need {
		if h != "authorization" && !listMatches(allowed, h) {
			p.add("%s: ext_authz allowed_headers lacks %s (%s): Envoy would not send it to the HTTP door", name, h, why)
		}
	}
	resp := hs.GetAuthorizationResponse()
	if !listMatches(resp.GetAllowedUpstreamHeaders(), "x-client-id") {
		p.add("%s: http_service allowed_upstream_headers lacks x-client-id: the app would not learn the client", name)
	}
	for _, h := range []string{"ratelimit-policy", "ratelimit"} {
		if !listMatches(resp.GetAllowedClientHeadersOnSuccess(), h) {
			p.add("%s: http_service allowed_client_headers_on_success lacks %s: clients would not see their limits", name, h)
		}
	}
	if resp.GetAllowedClientHeaders() != nil {
		for _, h := range []string{"retry-after", "ratelimit-policy", "ratelimit", "content-type"} {
			if !listMatches(resp.GetAllowedClientHeaders(), h) {
				p.add("%s: http_service allowed_client_headers lacks %s: a 429 would lose it", name, h)
			}
		}
	}
}

// listMatches reports whether a header name (lower case, as Envoy keeps
// them) matches one of list's patterns.
func listMatches(list *matcherv3.ListStringMatcher, name string) bool {
	for _, m := range list.GetPatterns() {
		v, n := name, ""
		switch {
		case m.GetExact() != "":
			n = m.GetExact()
		case m.GetPrefix() != "":
			n = m.GetPrefix()
		case m.GetSuffix() != "":
			n = m.GetSuffix()
		case m.GetContains() != "":
			n = m.GetContains()
		}
		if m.GetIgnoreCase() {
			v, n = strings.ToLower(v), strings.ToLower(n)
		}
		switch {
		case m.GetExact() != "" && v == n,
			m.GetPrefix() != "" && strings.HasPrefix(v, n),
			m.GetSuffix() != "" && strings.HasSuffix(v, n),
			m.GetContains() != "" && strings.Contains(v, n):
			return true
		}
	}
	return false
}

// checkExtAuthzCluster checks the cluster ext_authz calls: HTTP/2, and
// every endpoint where the extauthz config listens.
func checkExtAuthzCluster(p *problems, name string, b *bootstrapv3.Bootstrap, clusterName string, sc *sidecarConfig) {
	c := clusterByName(b, clusterName)
	if c == nil {
		p.add("%s: ext_authz cluster %q is not defined", name, clusterName)
		return
	}
	opts, ok := unpack[*httpv3.HttpProtocolOptions](c.GetTypedExtensionProtocolOptions()[httpOptionsKey])
	if !ok || opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		p.add("%s: cluster %s is not HTTP/2 (typed_extension_protocol_options %s explicit_http_config.http2_protocol_options): gRPC needs it", name, clusterName, httpOptionsKey)
	}
	var th *clusterv3.CircuitBreakers_Thresholds
	for _, t := range c.GetCircuitBreakers().GetThresholds() {
		if t.GetPriority() == corev3.RoutingPriority_DEFAULT {
			th = t
		}
	}
	switch {
	case th == nil || th.GetMaxRequests() == nil || th.GetMaxPendingRequests() == nil:
		p.add("%s: cluster %s: set circuit_breakers max_requests and max_pending_requests, sized for %d Checks in flight (docs/deploying.md)", name, clusterName, checksInFlight)
	case th.GetMaxRequests().GetValue() < checksInFlight:
		p.add("%s: cluster %s: circuit_breakers max_requests %d is below the %d Checks in flight it is sized for", name, clusterName, th.GetMaxRequests().GetValue(), checksInFlight)
	}
	listen, err := sc.grpcEndpoint()
	if err != nil {
		p.add("%s: extauthz listen.grpc: %v", name, err)
		return
	}
	addrs, pipes := socketAddresses(c), pipePaths(c)
	if len(addrs)+len(pipes) == 0 {
		p.add("%s: cluster %s has no endpoints", name, clusterName)
		return
	}
	for _, sa := range addrs {
		if !listen.reaches(sa.GetAddress(), sa.GetPortValue()) {
			p.add("%s: cluster %s sends Checks to %s:%d, but extauthz listens on %s", name, clusterName, sa.GetAddress(), sa.GetPortValue(), sc.Listen.GRPC)
		}
	}
	for _, pipe := range pipes {
		if listen.unix != pipe {
			p.add("%s: cluster %s sends Checks to unix %s, but extauthz listens on %s", name, clusterName, pipe, sc.Listen.GRPC)
		}
	}
}

// checkRoutes checks per-route ext_authz settings: health checks bypass it,
// every context_extensions selects a policy, every context policy is
// selected by some route, and per-filter configs name filters that exist.
func checkRoutes(p *problems, name string, b *bootstrapv3.Bootstrap, h *hcmv3.HttpConnectionManager, sc *sidecarConfig, filters map[string]bool) {
	rc := h.GetRouteConfig()
	if rc == nil {
		p.add("%s: http_connection_manager needs an inline route_config", name)
		return
	}
	healthBypass := false
	var contexts []map[string]string
	for _, vh := range rc.GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			rname := fmt.Sprintf("route %q", r.GetName())
			if cl := r.GetRoute().GetCluster(); cl != "" && clusterByName(b, cl) == nil {
				p.add("%s: %s goes to undefined cluster %q", name, rname, cl)
			}
			for key := range r.GetTypedPerFilterConfig() {
				if !filters[key] {
					p.add("%s: %s configures filter %q, which is not in the filter chain (Envoy ignores it)", name, rname, key)
				}
			}
			per, ok := unpack[*extauthzv3.ExtAuthzPerRoute](r.GetTypedPerFilterConfig()[extAuthzFilter])
			if !ok {
				continue
			}
			if per.GetDisabled() {
				if strings.Contains(routePath(r), "health") {
					healthBypass = true
				}
				continue
			}
			if ext := per.GetCheckSettings().GetContextExtensions(); len(ext) > 0 {
				contexts = append(contexts, ext)
				selected := false
				for _, pol := range sc.Policies {
					if len(pol.Match.Context) > 0 && contextSelects(pol.Match.Context, ext) {
						selected = true
					}
				}
				if !selected {
					p.add("%s: %s sends context_extensions %v, which select no extauthz policy", name, rname, ext)
				}
			}
		}
	}
	if !healthBypass {
		p.add("%s: no health-check route with ExtAuthzPerRoute disabled: probes would need a key and spend quota", name)
	}
	for _, pol := range sc.Policies {
		if len(pol.Match.Context) == 0 {
			continue
		}
		used := false
		for _, ext := range contexts {
			if contextSelects(pol.Match.Context, ext) {
				used = true
			}
		}
		if !used {
			p.add("%s: extauthz policy %s matches context %v, which no route sends", name, pol.Name, pol.Match.Context)
		}
	}
}

func routePath(r *routev3.Route) string {
	m := r.GetMatch()
	return m.GetPath() + m.GetPrefix() + m.GetPathSeparatedPrefix()
}

// TestEnvoyBootstraps checks each bootstrap under envoy/ with the extauthz
// config it is paired with: envoy/envoy[-X].yaml with envoy/extauthz[-X].yaml.
func TestEnvoyBootstraps(t *testing.T) {
	files := globYAML(t, "envoy")
	configs := map[string]bool{}
	descriptors := map[string][]byte{} // ratelimit*.yaml, by name: what rls.domains names
	for _, f := range files {
		base := filepath.Base(f)
		switch {
		case strings.HasPrefix(base, "extauthz"):
			configs[f] = false
		case strings.HasPrefix(base, "ratelimit"):
			descriptors[base] = readFile(t, f)
		case !strings.HasPrefix(base, "envoy"):
			t.Errorf("%s: envoy/ holds envoy*.yaml bootstraps, extauthz*.yaml configs and ratelimit*.yaml descriptor files only", rel(t, f))
		}
	}
	named := map[string]bool{}
	for _, f := range files {
		base := filepath.Base(f)
		if !strings.HasPrefix(base, "envoy") {
			continue
		}
		t.Run(base, func(t *testing.T) {
			pair := filepath.Join(filepath.Dir(f), "extauthz"+strings.TrimPrefix(base, "envoy"))
			if _, ok := configs[pair]; !ok {
				t.Fatalf("%s has no paired extauthz config %s", rel(t, f), rel(t, pair))
			}
			configs[pair] = true
			raw := readFile(t, f)
			b, err := loadBootstrap(raw)
			if err != nil {
				t.Fatalf("%s: %v", rel(t, f), err)
			}
			sc, err := parseSidecarConfig(readFile(t, pair))
			if err != nil {
				t.Fatalf("%s: %v", rel(t, pair), err)
			}
			if err := sc.loadDomains(descriptors); err != nil {
				t.Fatalf("%s: %v", rel(t, pair), err)
			}
			for _, d := range sc.RLS.Domains {
				named[d] = true
			}
			var p problems
			checkBootstrap(&p, rel(t, f), raw, b, sc)
			p.report(t)
		})
	}
	for f, paired := range configs {
		t.Run(filepath.Base(f), func(t *testing.T) {
			if !paired {
				t.Errorf("%s has no envoy bootstrap paired with it", rel(t, f))
			}
			validateSidecarConfig(t, rel(t, f), readFile(t, f), descriptors)
		})
	}
	for d := range descriptors {
		if !named[d] {
			t.Errorf("envoy/%s: a descriptor file no extauthz config names in rls.domains", d)
		}
	}
}

// TestEnvoyImageMatchesAPI checks that the Envoy image the manifests run is
// the release whose API the sidecar speaks and these tests validate
// against: go-control-plane's envoy module is versioned with Envoy. The
// version is the one each module's go.mod selects, as `go list -m` reports
// it (a test binary carries no dependency list in its build info): the
// product's module (the protos the sidecar is built with) and this one
// (the protos the configs are validated with) must agree, and every Envoy
// image must be a release of that minor version.
func TestEnvoyImageMatchesAPI(t *testing.T) {
	root := repoRoot(t)
	product := envoyAPIVersion(t, root)
	here := envoyAPIVersion(t, ".")
	if product != here {
		t.Errorf("go-control-plane/envoy is %s in go.mod and %s in tests/deploy/go.mod: the configs are validated against another API than the sidecar speaks", product, here)
	}
	minor := regexp.MustCompile(`^v\d+\.\d+`).FindString(product)
	if minor == "" {
		t.Fatalf("go-control-plane/envoy version %q: want vMAJOR.MINOR...", product)
	}
	images := envoyImages(t)
	if len(images) == 0 {
		t.Fatal("no envoyproxy/envoy image in k8s/")
	}
	for _, img := range images {
		tag := img[strings.LastIndex(img, ":")+1:]
		if !strings.HasPrefix(tag, minor+".") && tag != minor+"-latest" {
			t.Errorf("image %s: the sidecar speaks and the tests validate Envoy API %s; use an %s.x image or move go.mod and tests/deploy/go.mod", img, product, minor)
		}
	}
}

// envoyAPIVersion is the version of go-control-plane's envoy module that
// the module in dir selects.
func envoyAPIVersion(t *testing.T, dir string) string {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/envoyproxy/go-control-plane/envoy")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list -m in %s: %v\n%s", dir, err, stderr)
	}
	v := strings.TrimSpace(string(out))
	if v == "" {
		t.Fatalf("go list -m in %s: no version for go-control-plane/envoy", dir)
	}
	return v
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
