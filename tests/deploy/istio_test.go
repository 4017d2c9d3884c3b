package deploy

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"regexp"

	"google.golang.org/protobuf/encoding/protojson"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networkingistio "istio.io/api/networking/v1"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	securityistio "istio.io/api/security/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

const meshConfigFile = "k8s/istio/mesh-config.yaml"

// meshInfo is the Helm values file registering extauthz with Istio.
type meshInfo struct {
	providers        map[string]*meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyExternalAuthorizationGrpcProvider
	explicitFailOpen map[string]bool
	statsMatcher     *meshv1alpha1.ProxyConfig_ProxyStatsMatcher
	pathNorm         *meshv1alpha1.MeshConfig_ProxyPathNormalization
}

// loadMeshConfig decodes k8s/istio/mesh-config.yaml, failing t if it does
// not decode.
func loadMeshConfig(t *testing.T) *meshInfo {
	t.Helper()
	m, err := parseMeshConfig(readFile(t, repoPath(t, meshConfigFile)))
	if err != nil {
		t.Fatalf("%s: %v", meshConfigFile, err)
	}
	return m
}

// parseMeshConfig decodes Helm values whose only key, meshConfig, must
// decode strictly into Istio's MeshConfig.
func parseMeshConfig(data []byte) (*meshInfo, error) {
	js, err := strictJSON(data)
	if err != nil {
		return nil, err
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(js, &top); err != nil {
		return nil, err
	}
	for k := range top {
		if k != "meshConfig" {
			return nil, fmt.Errorf("unexpected key %q: the file holds meshConfig only", k)
		}
	}
	var mc meshv1alpha1.MeshConfig
	if err := protojson.Unmarshal(top["meshConfig"], &mc); err != nil {
		return nil, fmt.Errorf("meshConfig: %w", err)
	}
	var raw struct {
		ExtensionProviders []struct {
			Name              string         `json:"name"`
			EnvoyExtAuthzGrpc map[string]any `json:"envoyExtAuthzGrpc"`
		} `json:"extensionProviders"`
	}
	if err := json.Unmarshal(top["meshConfig"], &raw); err != nil {
		return nil, err
	}
	m := &meshInfo{
		providers:        map[string]*meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyExternalAuthorizationGrpcProvider{},
		explicitFailOpen: map[string]bool{},
	}
	m.statsMatcher = mc.GetDefaultConfig().GetProxyStatsMatcher()
	m.pathNorm = mc.GetPathNormalization()
	for _, p := range mc.GetExtensionProviders() {
		if g := p.GetEnvoyExtAuthzGrpc(); g != nil {
			m.providers[p.GetName()] = g
		}
	}
	for _, p := range raw.ExtensionProviders {
		_, m.explicitFailOpen[p.Name] = p.EnvoyExtAuthzGrpc["failOpen"]
	}
	return m, nil
}

// TestMeshConfig checks each extauthz provider's settings.
func TestMeshConfig(t *testing.T) {
	m := loadMeshConfig(t)
	if len(m.providers) == 0 {
		t.Fatalf("%s: no envoyExtAuthzGrpc provider", meshConfigFile)
	}
	var p problems
	for name, g := range m.providers {
		checkProvider(&p, name, g, m.explicitFailOpen[name])
	}
	checkStatsMatcher(&p, m.statsMatcher)
	checkPathNormalization(&p, meshConfigFile, m.pathNorm)
	p.report(t)
}

// checkPathNormalization checks the mesh normalises paths as extauthz
// matches them (engine.NormalizePath: dot segments, merged slashes, %2F
// decoded). Istio's default, BASE, merges no slashes: //orders would be
// routed, and reach the app, as a path no path_prefix policy on /orders
// saw.
func checkPathNormalization(p *problems, where string, pn *meshv1alpha1.MeshConfig_ProxyPathNormalization) {
	if got := pn.GetNormalization(); got != meshv1alpha1.MeshConfig_ProxyPathNormalization_DECODE_AND_MERGE_SLASHES {
		p.add("%s: pathNormalization.normalization %v: want DECODE_AND_MERGE_SLASHES, the path extauthz's policies match", where, got)
	}
}

// The install notes of the shared layout print the mesh config to register
// the provider with: it decodes as Istio's MeshConfig, and normalises paths
// as k8s/istio/mesh-config.yaml does.
func TestChartNotesMeshConfig(t *testing.T) {
	out, err := renderChart(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	notes := out[chartDir[len("charts/"):]+"/templates/NOTES.txt"]
	i := strings.Index(notes, "\nmeshConfig:\n")
	if i < 0 {
		t.Fatalf("NOTES.txt prints no meshConfig block:\n%s", notes)
	}
	block := notes[i+1:]
	if j := strings.Index(block, "\n\n"); j >= 0 {
		block = block[:j+1]
	}
	m, err := parseMeshConfig([]byte(block))
	if err != nil {
		t.Fatalf("NOTES.txt's meshConfig: %v\n%s", err, block)
	}
	var p problems
	if len(m.providers) != 1 {
		p.add("NOTES.txt: %d envoyExtAuthzGrpc providers, want 1", len(m.providers))
	}
	for name, g := range m.providers {
		checkProvider(&p, name, g, m.explicitFailOpen[name])
	}
	checkPathNormalization(&p, "NOTES.txt", m.pathNorm)
	p.report(t)
}

// extAuthzStats are names Istio's proxies give the ext_authz filter's
// counters (an inbound listener's HTTP connection manager, and the route's
// cluster): the alerts need them exported.
var extAuthzStats = []string{
	"http.inbound_0.0.0.0_8080.ext_authz.error",
	"http.inbound_0.0.0.0_8080.ext_authz.failure_mode_allowed",
	"cluster.inbound|8080||.ext_authz.denied",
}

// checkStatsMatcher checks the mesh's proxyStatsMatcher lets the ext_authz
// counters through: Istio's proxies drop most Envoy stats by default.
// Envoy's regexes are RE2, as Go's are.
func checkStatsMatcher(p *problems, sm *meshv1alpha1.ProxyConfig_ProxyStatsMatcher) {
	for _, stat := range extAuthzStats {
		kept := false
		for _, prefix := range sm.GetInclusionPrefixes() {
			kept = kept || strings.HasPrefix(stat, prefix)
		}
		for _, suffix := range sm.GetInclusionSuffixes() {
			kept = kept || strings.HasSuffix(stat, suffix)
		}
		for _, re := range sm.GetInclusionRegexps() {
			rx, err := regexp.Compile("^(?:" + re + ")$")
			if err != nil {
				p.add("%s: proxyStatsMatcher regexp %q: %v", meshConfigFile, re, err)
				continue
			}
			kept = kept || rx.MatchString(stat)
		}
		if !kept {
			p.add("%s: defaultConfig.proxyStatsMatcher does not export %s: the Envoy-side alerts would see nothing", meshConfigFile, stat)
		}
	}
}

func checkProvider(p *problems, name string, g *meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyExternalAuthorizationGrpcProvider, explicitFailOpen bool) {
	where := fmt.Sprintf("%s: provider %s", meshConfigFile, name)
	if g.GetService() == "" || g.GetPort() == 0 {
		p.add("%s: needs service and port", where)
	}
	if d := g.GetTimeout().AsDuration(); g.GetTimeout() == nil || d <= 0 || d > maxCheckTimeout {
		p.add("%s: timeout %v: set it, at most %v", where, d, maxCheckTimeout)
	}
	if !explicitFailOpen {
		p.add("%s: state failOpen explicitly, with the reason", where)
	}
	if s := g.GetStatusOnError(); len(s) != 3 || s[0] != '5' {
		p.add("%s: statusOnError %q: want a 5xx (the default 403 blames the client)", where, s)
	}
	if g.GetIncludeRequestBodyInCheck() != nil {
		p.add("%s: includeRequestBodyInCheck: extauthz decides on headers", where)
	}
}

// checkIstio checks the Istio resources of an apply set against each other,
// the mesh config, and the pods they select.
func checkIstio(p *problems, s *set, mesh *meshInfo) {
	for _, pod := range s.pods {
		if pod.extauthz != nil && inMesh(s, pod) && pod.annotations[nativeSidecarAnnotation] != "true" {
			p.add("Deployment %s: runs extauthz in Istio's mesh without %s: \"true\": its probes go through istio-proxy, which would start after it", pod.deployment, nativeSidecarAnnotation)
		}
	}
	for _, o := range s.objs {
		switch spec := o.spec.(type) {
		case *securityistio.AuthorizationPolicy:
			if spec.GetAction() == securityistio.AuthorizationPolicy_CUSTOM {
				checkCustomPolicy(p, s, mesh, o, spec)
			}
		case *networkingistio.ServiceEntry:
			if len(spec.GetExportTo()) != 1 || spec.GetExportTo()[0] != "." {
				p.add("%s: exportTo [\".\"]: the name is for this namespace's proxies only", o)
			}
		case *networkingv1alpha3.EnvoyFilter:
			checkEnvoyFilter(p, s, o, spec)
		}
	}
}

// checkCustomPolicy follows a CUSTOM AuthorizationPolicy to the extauthz
// that will answer it: provider, then ServiceEntry or Service, then the
// extauthz container's listen address.
func checkCustomPolicy(p *problems, s *set, mesh *meshInfo, o *object, ap *securityistio.AuthorizationPolicy) {
	name := ap.GetProvider().GetName()
	g := mesh.providers[name]
	if g == nil {
		p.add("%s: provider %q is not an envoyExtAuthzGrpc provider in %s", o, name, meshConfigFile)
		return
	}
	var apps []*podInfo
	for _, pod := range s.pods {
		if selects(ap.GetSelector().GetMatchLabels(), pod.labels) {
			apps = append(apps, pod)
		}
	}
	if len(apps) == 0 {
		p.add("%s: selector %v matches no Deployment in apply set %s", o, ap.GetSelector().GetMatchLabels(), s.name)
	}
	healthExempt := false
	for _, r := range ap.GetRules() {
		for _, to := range r.GetTo() {
			for _, np := range to.GetOperation().GetNotPaths() {
				if strings.Contains(np, "health") {
					healthExempt = true
				}
			}
			for _, port := range to.GetOperation().GetPorts() {
				for _, app := range apps {
					if _, ok := resolvePort(app.spec.Containers, app.spec.InitContainers, intstr.Parse(port)); !ok {
						p.add("%s: rule port %s is not a port of %s", o, port, app.deployment)
					}
				}
			}
		}
	}
	if !healthExempt {
		p.add("%s: exempt health checks (notPaths): probes would need a key and spend quota", o)
	}

	service, port := g.GetService(), g.GetPort()
	if host, ok := strings.CutSuffix(service, ".local"); ok && !strings.Contains(host, ".svc.cluster") {
		// Same pod: a ServiceEntry names 127.0.0.1, and each selected pod
		// runs an extauthz listening there.
		se := serviceEntryFor(s, service)
		if se == nil {
			p.add("%s: provider %s calls %s, but no ServiceEntry in apply set %s defines it", o, name, service, s.name)
			return
		}
		found := false
		for _, sp := range se.GetPorts() {
			if sp.GetNumber() == port && strings.EqualFold(sp.GetProtocol(), "GRPC") {
				found = true
			}
		}
		if !found {
			p.add("%s: ServiceEntry %s has no GRPC port %d", o, service, port)
		}
		for _, ep := range se.GetEndpoints() {
			for _, app := range apps {
				if app.extauthz == nil {
					p.add("%s: %s has no extauthz container for provider %s to call", o, app.deployment, name)
					continue
				}
				l, err := app.extauthz.grpcEndpoint()
				if err == nil && !l.reaches(ep.GetAddress(), port) {
					p.add("%s: provider %s calls %s:%d, but %s's extauthz listens on %s", o, name, ep.GetAddress(), port, app.deployment, app.extauthz.Listen.GRPC)
				}
			}
		}
		return
	}
	// Shared: a Service in this set, selecting an extauthz Deployment that
	// listens on the port the Service targets.
	svcName, ns, _ := strings.Cut(strings.TrimSuffix(service, ".svc.cluster.local"), ".")
	so := s.find("Service", svcName)
	if so == nil || so.meta.Namespace != ns {
		p.add("%s: provider %s calls %s, but apply set %s has no Service %s in namespace %s", o, name, service, s.name, svcName, ns)
		return
	}
	svc := so.k8s.(*corev1.Service)
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if uint32(svc.Spec.Ports[i].Port) == port {
			sp = &svc.Spec.Ports[i]
		}
	}
	if sp == nil {
		p.add("%s: Service %s has no port %d", o, svcName, port)
		return
	}
	if sp.AppProtocol == nil || *sp.AppProtocol != "grpc" {
		p.add("%s: Service %s port %d needs appProtocol: grpc so the mesh speaks HTTP/2 to it", o, svcName, port)
	}
	for _, pod := range s.pods {
		if !selects(svc.Spec.Selector, pod.labels) {
			continue
		}
		if pod.extauthz == nil {
			p.add("%s: Service %s selects %s, which runs no extauthz", o, svcName, pod.deployment)
			continue
		}
		cp, ok := resolvePort(pod.spec.Containers, pod.spec.InitContainers, sp.TargetPort)
		l, err := pod.extauthz.grpcEndpoint()
		if !ok || err != nil || uint32(cp.ContainerPort) != l.port || l.isLoopback() {
			p.add("%s: Service %s port %d does not reach extauthz's listen.grpc %s in %s", o, svcName, port, pod.extauthz.Listen.GRPC, pod.deployment)
		}
	}
}

// nativeSidecarAnnotation makes Istio inject istio-proxy as a native
// sidecar (Istio 1.24+).
const nativeSidecarAnnotation = "sidecar.istio.io/nativeSidecar"

// inMesh reports whether Istio injects a proxy into pod: by its label, or
// by its namespace's istio-injection label.
func inMesh(s *set, pod *podInfo) bool {
	if pod.labels["sidecar.istio.io/inject"] == "true" {
		return true
	}
	ns := s.find("Namespace", pod.namespace)
	return ns != nil && ns.meta.Labels["istio-injection"] == "enabled"
}

func serviceEntryFor(s *set, host string) *networkingistio.ServiceEntry {
	for _, o := range s.objs {
		if se, ok := o.spec.(*networkingistio.ServiceEntry); ok {
			for _, h := range se.GetHosts() {
				if h == host {
					return se
				}
			}
		}
	}
	return nil
}

// strictMTLS reports whether an Istio PeerAuthentication selecting pods
// with labels requires mTLS on port (STRICT, not relaxed for that port).
func strictMTLS(s *set, labels map[string]string, port int32) bool {
	for _, o := range s.objs {
		pa, ok := o.spec.(*securityistio.PeerAuthentication)
		if !ok || !selects(pa.GetSelector().GetMatchLabels(), labels) {
			continue
		}
		mode := pa.GetMtls().GetMode()
		if pm, ok := pa.GetPortLevelMtls()[uint32(port)]; ok {
			mode = pm.GetMode()
		}
		if mode == securityistio.PeerAuthentication_MutualTLS_STRICT {
			return true
		}
	}
	return false
}

// openAllowRules returns a description of each rule of an Istio ALLOW
// policy selecting pods with labels that lets a caller reach port without
// naming it: no from clause, a source with neither namespaces nor
// principals, or a "*" among them.
func openAllowRules(s *set, labels map[string]string, port int32) []string {
	var out []string
	want := strconv.Itoa(int(port))
	for _, o := range s.objs {
		ap, ok := o.spec.(*securityistio.AuthorizationPolicy)
		if !ok || ap.GetAction() != securityistio.AuthorizationPolicy_ALLOW || !selects(ap.GetSelector().GetMatchLabels(), labels) {
			continue
		}
		for i, r := range ap.GetRules() {
			covers := len(r.GetTo()) == 0
			for _, to := range r.GetTo() {
				ports := to.GetOperation().GetPorts()
				if len(ports) == 0 || slices.Contains(ports, want) {
					covers = true
				}
			}
			if !covers {
				continue
			}
			if len(r.GetFrom()) == 0 {
				out = append(out, fmt.Sprintf("%s: rule %d admits any caller to port %s; name the namespaces that use extauthz (source: {namespaces: [...]})", o, i, want))
			}
			for _, f := range r.GetFrom() {
				src := f.GetSource()
				names := append(append([]string{}, src.GetNamespaces()...), src.GetPrincipals()...)
				if len(names) == 0 || slices.Contains(names, "*") {
					out = append(out, fmt.Sprintf("%s: rule %d admits any mesh identity to port %s; name the namespaces that use extauthz (source: {namespaces: [...]}) or their principals", o, i, want))
				}
			}
		}
	}
	return out
}

// hasAllowPolicy reports whether an Istio ALLOW AuthorizationPolicy selects
// pods with labels and names who may call (a from clause).
func hasAllowPolicy(s *set, labels map[string]string) bool {
	for _, o := range s.objs {
		ap, ok := o.spec.(*securityistio.AuthorizationPolicy)
		if !ok || ap.GetAction() != securityistio.AuthorizationPolicy_ALLOW || !selects(ap.GetSelector().GetMatchLabels(), labels) {
			continue
		}
		for _, r := range ap.GetRules() {
			if len(r.GetFrom()) > 0 {
				return true
			}
		}
	}
	return false
}
