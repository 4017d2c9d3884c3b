package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	networkingistio "istio.io/api/networking/v1"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	securityistio "istio.io/api/security/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/validation"
)

// manifestDirs hold Kubernetes manifests: every YAML document below them
// must decode into a known kind.
var manifestDirs = []string{"k8s", "scripts/kind"}

// helmValues are YAML files under manifestDirs that are Helm values, not
// manifests.
var helmValues = map[string]bool{"k8s/istio/mesh-config.yaml": true}

// applySets are the groups of files applied together, as docs/deploying.md
// and scripts/kind/apply.sh apply them. References (a Secret a pod reads, the
// Deployment a Service selects) must resolve within the set.
var applySets = map[string][]string{
	"sidecar":        {"k8s/redis", "k8s/sidecar", "scripts/kind/nodeport.yaml"},
	"istio-same-pod": {"k8s/redis", "k8s/istio/same-pod"},
	"istio-shared":   {"k8s/redis", "k8s/istio/shared"},
	// The shared extauthz as Istio's global rate limit service.
	"istio-ratelimit": {"k8s/redis", "k8s/istio/shared", "k8s/istio/ratelimit"},
}

// Istio CRDs and the istio.io/api message their spec decodes into.
var istioKinds = map[string]func() proto.Message{
	"security.istio.io/v1/AuthorizationPolicy":   func() proto.Message { return &securityistio.AuthorizationPolicy{} },
	"security.istio.io/v1/PeerAuthentication":    func() proto.Message { return &securityistio.PeerAuthentication{} },
	"networking.istio.io/v1/ServiceEntry":        func() proto.Message { return &networkingistio.ServiceEntry{} },
	"security.istio.io/v1/RequestAuthentication": func() proto.Message { return &securityistio.RequestAuthentication{} },
	"networking.istio.io/v1alpha3/EnvoyFilter":   func() proto.Message { return &networkingv1alpha3.EnvoyFilter{} },
}

// object is one decoded manifest document.
type object struct {
	file string // relative to the repository root
	kind string
	meta metav1.ObjectMeta
	k8s  runtime.Object // for Kubernetes kinds
	spec proto.Message  // for Istio kinds
	raw  map[string]any // the document as JSON, for presence checks
}

func (o *object) String() string { return fmt.Sprintf("%s: %s %s", o.file, o.kind, o.meta.Name) }

var k8sDecoder = func() runtime.Decoder {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme, networkingv1.AddToScheme,
		autoscalingv2.AddToScheme, monitoringv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	// Strict: unknown and duplicate fields are errors, as with
	// kubectl apply --validate=strict.
	return kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme,
		kjson.SerializerOptions{Yaml: true, Strict: true})
}()

// decodeManifest decodes one YAML document strictly.
func decodeManifest(file string, doc []byte) (*object, error) {
	js, err := strictJSON(doc)
	if err != nil {
		return nil, err
	}
	var raw map[string]any
	if err := json.Unmarshal(js, &raw); err != nil {
		return nil, err
	}
	apiVersion, _ := raw["apiVersion"].(string)
	kind, _ := raw["kind"].(string)
	if apiVersion == "" || kind == "" {
		return nil, fmt.Errorf("document without apiVersion and kind")
	}
	o := &object{file: file, kind: kind, raw: raw}
	if newSpec, ok := istioKinds[apiVersion+"/"+kind]; ok {
		for k := range raw {
			if k != "apiVersion" && k != "kind" && k != "metadata" && k != "spec" {
				return nil, fmt.Errorf("%s: unknown field %q", kind, k)
			}
		}
		if err := strictUnmarshal(raw["metadata"], &o.meta); err != nil {
			return nil, fmt.Errorf("%s metadata: %w", kind, err)
		}
		spec, _ := json.Marshal(raw["spec"])
		o.spec = newSpec()
		if err := protojson.Unmarshal(spec, o.spec); err != nil {
			return nil, fmt.Errorf("%s %s spec: %w", kind, o.meta.Name, err)
		}
		return o, nil
	}
	if strings.Contains(apiVersion, "istio.io/") {
		return nil, fmt.Errorf("%s %s: not a kind these tests know; add it to istioKinds", apiVersion, kind)
	}
	obj, _, err := k8sDecoder.Decode(doc, nil, nil)
	if err != nil {
		return nil, err
	}
	acc, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%s has no metadata", kind)
	}
	o.k8s = obj
	o.meta = metav1.ObjectMeta{Name: acc.GetName(), Namespace: acc.GetNamespace(), Labels: acc.GetLabels()}
	return o, nil
}

func strictUnmarshal(v any, into any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	return d.Decode(into)
}

// manifestFiles reads every manifest file under manifestDirs, by path
// relative to the repository root.
func manifestFiles(t *testing.T) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	for _, dir := range manifestDirs {
		for _, f := range globYAML(t, dir) {
			if r := rel(t, f); !helmValues[r] {
				files[r] = readFile(t, f)
			}
		}
	}
	return files
}

// decodeFiles decodes every document of every file.
func decodeFiles(files map[string][]byte) ([]*object, []error) {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var objs []*object
	var errs []error
	for _, n := range names {
		docs, err := splitYAML(files[n])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n, err))
			continue
		}
		for i, doc := range docs {
			o, err := decodeManifest(n, doc)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: document %d: %w", n, i+1, err))
				continue
			}
			objs = append(objs, o)
		}
	}
	return objs, errs
}

// loadManifests decodes every manifest under manifestDirs, failing the test
// on any that does not decode.
func loadManifests(t *testing.T) []*object {
	t.Helper()
	objs, errs := decodeFiles(manifestFiles(t))
	for _, err := range errs {
		t.Error(err)
	}
	return objs
}

// TestManifestsDecode checks every manifest decodes strictly, names are
// valid, and every file belongs to an apply set.
func TestManifestsDecode(t *testing.T) {
	objs := loadManifests(t)
	files := map[string]bool{}
	for _, o := range objs {
		files[o.file] = true
		if errs := validation.IsDNS1123Subdomain(o.meta.Name); len(errs) > 0 {
			t.Errorf("%s: name: %s", o, strings.Join(errs, "; "))
		}
		for k, v := range o.meta.Labels {
			if errs := validation.IsQualifiedName(k); len(errs) > 0 {
				t.Errorf("%s: label %q: %s", o, k, strings.Join(errs, "; "))
			}
			if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
				t.Errorf("%s: label %s=%q: %s", o, k, v, strings.Join(errs, "; "))
			}
		}
	}
	for f := range files {
		in := false
		for _, set := range applySets {
			for _, p := range set {
				if f == p || strings.HasPrefix(f, p+"/") {
					in = true
				}
			}
		}
		if !in {
			t.Errorf("%s is in no apply set: add it to applySets so its references are checked", f)
		}
	}
}

// set is one apply set's objects, indexed for references.
type set struct {
	name string
	objs []*object
	pods []*podInfo // filled by checkDeployment
	// The domain of the ratelimit filter an EnvoyFilter adds, and the
	// EnvoyFilters' rate_limits waiting to be checked against it.
	rlDomain  *rlDomain
	rlPending []pendingRateLimits
}

// buildSet gathers apply set name's objects; a kind and name defined twice
// is a problem.
func buildSet(p *problems, all []*object, name string) *set {
	s := &set{name: name}
	for _, o := range all {
		for _, path := range applySets[name] {
			if o.file == path || strings.HasPrefix(o.file, path+"/") {
				s.objs = append(s.objs, o)
			}
		}
	}
	seen := map[string]string{}
	for _, o := range s.objs {
		key := o.kind + "/" + o.meta.Name
		if prev, dup := seen[key]; dup {
			p.add("apply set %s: %s %s is defined in %s and %s", name, o.kind, o.meta.Name, prev, o.file)
		}
		seen[key] = o.file
	}
	return s
}

// checkSet runs every check of an apply set.
func checkSet(p *problems, s *set, mesh *meshInfo) {
	if len(s.deployments()) == 0 {
		p.add("apply set %s has no Deployment", s.name)
	}
	for _, d := range s.deployments() {
		s.pods = append(s.pods, checkDeployment(p, s, d))
	}
	for _, o := range s.objs {
		switch obj := o.k8s.(type) {
		case *corev1.Service:
			checkService(p, s, o, obj)
		case *policyv1.PodDisruptionBudget:
			checkPDB(p, s, o, obj)
		case *networkingv1.NetworkPolicy:
			checkNetworkPolicy(p, s, o, obj)
		}
	}
	checkIstio(p, s, mesh)
	checkPendingRateLimits(p, s)
	checkIsolation(p, s)
}

func (s *set) find(kind, name string) *object {
	for _, o := range s.objs {
		if o.kind == kind && o.meta.Name == name {
			return o
		}
	}
	return nil
}

func (s *set) deployments() []*object {
	var out []*object
	for _, o := range s.objs {
		if _, ok := o.k8s.(*appsv1.Deployment); ok {
			out = append(out, o)
		}
	}
	return out
}

// configMapKey returns the value of key in ConfigMap name, if both exist.
func (s *set) configMapKey(name, key string) (string, bool) {
	o := s.find("ConfigMap", name)
	if o == nil {
		return "", false
	}
	v, ok := o.k8s.(*corev1.ConfigMap).Data[key]
	return v, ok
}

func (s *set) secretHasKey(name, key string) bool {
	o := s.find("Secret", name)
	if o == nil {
		return false
	}
	sec := o.k8s.(*corev1.Secret)
	_, a := sec.Data[key]
	_, b := sec.StringData[key]
	return a || b
}

// selects reports whether a label selector (match labels only) selects
// labels. An empty selector selects nothing here: the manifests should
// always say what they mean.
func selects(sel map[string]string, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestApplySets checks each apply set's cross references and pods.
func TestApplySets(t *testing.T) {
	all := loadManifests(t)
	mesh := loadMeshConfig(t)
	names := make([]string, 0, len(applySets))
	for n := range applySets {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			var p problems
			checkSet(&p, buildSet(&p, all, name), mesh)
			p.report(t)
		})
	}
}

func checkService(p *problems, s *set, o *object, svc *corev1.Service) {
	var pods []*corev1.PodTemplateSpec
	for _, d := range s.deployments() {
		tpl := &d.k8s.(*appsv1.Deployment).Spec.Template
		if selects(svc.Spec.Selector, tpl.Labels) {
			pods = append(pods, tpl)
		}
	}
	if len(pods) == 0 {
		p.add("%s: selector %v matches no Deployment's pods", o, svc.Spec.Selector)
		return
	}
	for _, port := range svc.Spec.Ports {
		for _, pod := range pods {
			if _, ok := resolvePort(pod.Spec.Containers, pod.Spec.InitContainers, port.TargetPort); !ok {
				p.add("%s: port %s targets %s, which no container declares", o, port.Name, port.TargetPort.String())
			}
		}
	}
}

func checkPDB(p *problems, s *set, o *object, pdb *policyv1.PodDisruptionBudget) {
	matched := false
	for _, d := range s.deployments() {
		dep := d.k8s.(*appsv1.Deployment)
		if pdb.Spec.Selector == nil || !selects(pdb.Spec.Selector.MatchLabels, dep.Spec.Template.Labels) {
			continue
		}
		matched = true
		replicas := int32(1)
		if dep.Spec.Replicas != nil {
			replicas = *dep.Spec.Replicas
		}
		if m := pdb.Spec.MinAvailable; m != nil && m.IntVal >= replicas {
			p.add("%s: minAvailable %d with %d replicas blocks every drain", o, m.IntVal, replicas)
		}
	}
	if !matched {
		p.add("%s: selector matches no Deployment", o)
	}
}

func checkNetworkPolicy(p *problems, s *set, o *object, np *networkingv1.NetworkPolicy) {
	matched := false
	for _, d := range s.deployments() {
		tpl := &d.k8s.(*appsv1.Deployment).Spec.Template
		if !selects(np.Spec.PodSelector.MatchLabels, tpl.Labels) {
			continue
		}
		matched = true
		for _, rule := range np.Spec.Ingress {
			for _, port := range rule.Ports {
				if port.Port == nil {
					continue
				}
				// 15000 and up are Istio's own ports (15020: merged metrics).
				if _, ok := resolvePort(tpl.Spec.Containers, tpl.Spec.InitContainers, *port.Port); !ok && port.Port.IntVal < 15000 {
					p.add("%s: admits port %s, which no container of %s declares", o, port.Port.String(), d.meta.Name)
				}
			}
		}
	}
	if !matched {
		p.add("%s: podSelector matches no Deployment", o)
	}
}

// admitsPort reports whether some NetworkPolicy in s selects labels and
// lets other pods reach port (a rule with no ports admits every port).
// The second result says whether any policy selects the pods at all.
func admitsPort(s *set, labels map[string]string, port int32, name string) (admits, isolated bool) {
	for _, o := range s.objs {
		np, ok := o.k8s.(*networkingv1.NetworkPolicy)
		if !ok || !selects(np.Spec.PodSelector.MatchLabels, labels) {
			continue
		}
		isolated = true
		for _, rule := range np.Spec.Ingress {
			if len(rule.Ports) == 0 {
				admits = true
			}
			for _, pp := range rule.Ports {
				if pp.Port == nil || pp.Port.IntVal == port || pp.Port.StrVal == name && name != "" {
					admits = true
				}
			}
		}
	}
	return admits, isolated
}

// envoyImages returns the Envoy images the manifests run.
func envoyImages(t *testing.T) []string {
	var out []string
	for _, o := range loadManifests(t) {
		dep, ok := o.k8s.(*appsv1.Deployment)
		if !ok {
			continue
		}
		spec := dep.Spec.Template.Spec
		for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
			if isEnvoy(&c) {
				out = append(out, c.Image)
			}
		}
	}
	return out
}

// TestConfigMapConfigs checks every configuration carried in a ConfigMap,
// mounted or not: extauthz configs pass `extauthz validate`, Envoy
// bootstraps load and validate.
func TestConfigMapConfigs(t *testing.T) {
	n := 0
	for _, o := range loadManifests(t) {
		cm, ok := o.k8s.(*corev1.ConfigMap)
		if !ok {
			continue
		}
		siblings := map[string][]byte{}
		for key, text := range cm.Data {
			siblings[key] = []byte(text)
		}
		named := map[string]bool{} // descriptor files an extauthz config names
		for key, text := range cm.Data {
			where := fmt.Sprintf("%s (ConfigMap %s key %s)", o.file, cm.Name, key)
			switch {
			case strings.HasPrefix(key, "extauthz") && strings.HasSuffix(key, ".yaml"):
				n++
				validateSidecarConfig(t, where, []byte(text), siblings)
				if sc, err := parseSidecarConfig([]byte(text)); err == nil {
					for _, d := range sc.RLS.Domains {
						named[d] = true
					}
				}
			case strings.HasPrefix(key, "envoy") && strings.HasSuffix(key, ".yaml"):
				n++
				if _, err := loadBootstrap([]byte(text)); err != nil {
					t.Errorf("%s: %v", where, err)
				}
			case strings.HasPrefix(key, "ratelimit") && strings.HasSuffix(key, ".yaml"):
				// A descriptor file: checked by `extauthz validate` with
				// the config that names it.
			default:
				t.Errorf("%s: a key these tests do not know how to check; name it extauthz*.yaml, envoy*.yaml or ratelimit*.yaml (a descriptor file)", where)
			}
		}
		for key := range cm.Data {
			if strings.HasPrefix(key, "ratelimit") && !named[key] {
				t.Errorf("%s (ConfigMap %s key %s): a descriptor file no extauthz config in the ConfigMap names in rls.domains", o.file, cm.Name, key)
			}
		}
	}
	if n == 0 {
		t.Fatal("no ConfigMap carries an extauthz or Envoy config")
	}
}

// TestEnvoyConfigMapMatchesEnvoyDir checks the Envoy bootstrap in the
// sidecar ConfigMap is envoy/envoy.yaml, so a fix to one reaches the other.
func TestEnvoyConfigMapMatchesEnvoyDir(t *testing.T) {
	want, err := loadBootstrap(readFile(t, repoPath(t, "envoy/envoy.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	var text string
	for _, o := range loadManifests(t) {
		if cm, ok := o.k8s.(*corev1.ConfigMap); ok && o.file == "k8s/sidecar/envoy-config.yaml" {
			text = cm.Data["envoy.yaml"]
		}
	}
	if text == "" {
		t.Fatal("k8s/sidecar/envoy-config.yaml: no ConfigMap key envoy.yaml")
	}
	got, err := loadBootstrap([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, want) {
		t.Error("k8s/sidecar/envoy-config.yaml's envoy.yaml differs from envoy/envoy.yaml; keep them the same")
	}
}
