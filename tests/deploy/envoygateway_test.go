package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
)

// egDoc is one manifest of docs/envoy-gateway.md, decoded.
type egDoc struct {
	where string // the block and document, for messages
	kind  string
	obj   any
}

// egKinds are the kinds the page may show, each decoded into Envoy
// Gateway's own API type (github.com/envoyproxy/gateway/api/v1alpha1) or
// Kubernetes'.
var egKinds = map[string]func() any{
	"gateway.envoyproxy.io/v1alpha1 EnvoyGateway":         func() any { return &egv1a1.EnvoyGateway{} },
	"gateway.envoyproxy.io/v1alpha1 BackendTrafficPolicy": func() any { return &egv1a1.BackendTrafficPolicy{} },
	"gateway.envoyproxy.io/v1alpha1 SecurityPolicy":       func() any { return &egv1a1.SecurityPolicy{} },
	"v1 ConfigMap": func() any { return &corev1.ConfigMap{} },
}

// envoyGatewayDocs decodes every YAML block of docs/envoy-gateway.md
// strictly: a field the type does not have, or a key twice, fails.
func envoyGatewayDocs(t *testing.T) ([]egDoc, *problems) {
	t.Helper()
	p := &problems{}
	page := string(readFile(t, repoPath(t, "docs/envoy-gateway.md")))
	var docs []egDoc
	blocks := strings.Split(page, "\n```yaml\n")[1:]
	if len(blocks) == 0 {
		t.Fatal("docs/envoy-gateway.md has no yaml block")
	}
	for bi, rest := range blocks {
		block, _, ok := strings.Cut(rest, "\n```\n")
		if !ok {
			p.add("docs/envoy-gateway.md: yaml block %d is not closed", bi+1)
			continue
		}
		parts, err := splitYAML([]byte(block + "\n"))
		if err != nil {
			p.add("docs/envoy-gateway.md: yaml block %d: %v", bi+1, err)
			continue
		}
		for di, part := range parts {
			where := fmt.Sprintf("docs/envoy-gateway.md: yaml block %d, document %d", bi+1, di+1)
			js, err := strictJSON(part)
			if err != nil {
				p.add("%s: %v", where, err)
				continue
			}
			var head struct{ APIVersion, Kind string }
			if err := json.Unmarshal(js, &head); err != nil || head.Kind == "" {
				p.add("%s: no apiVersion and kind: every block is a whole manifest, so it can be checked (and applied)", where)
				continue
			}
			key := head.APIVersion + " " + head.Kind
			mk, ok := egKinds[key]
			if !ok {
				p.add("%s: %s is not a kind this test decodes", where, key)
				continue
			}
			obj := mk()
			dec := json.NewDecoder(bytes.NewReader(js))
			dec.DisallowUnknownFields()
			if err := dec.Decode(obj); err != nil {
				p.add("%s: %s: %v", where, head.Kind, err)
				continue
			}
			docs = append(docs, egDoc{where: where, kind: head.Kind, obj: obj})
		}
	}
	return docs, p
}

// The manifests docs/envoy-gateway.md shows decode strictly into Envoy
// Gateway's API types (the version tests/deploy/go.mod pins), and say
// what the page says of them: each EnvoyGateway changes the rate limit
// Deployment's image to extauthz's; a BackendTrafficPolicy has a global
// rate limit; a SecurityPolicy sends gRPC ext_authz to the rate limit
// Service's port 8081.
func TestEnvoyGatewayManifests(t *testing.T) {
	docs, p := envoyGatewayDocs(t)
	seen := map[string]int{}
	for _, d := range docs {
		seen[d.kind]++
		switch o := d.obj.(type) {
		case *egv1a1.EnvoyGateway:
			c := rateLimitContainer(o)
			if c == nil || c.Image == nil || !strings.Contains(*c.Image, "extauthz") {
				p.add("%s: provider.kubernetes.rateLimitDeployment.container.image is not extauthz's image", d.where)
			}
			if o.RateLimit == nil || o.RateLimit.Backend.Type != egv1a1.RedisBackendType || o.RateLimit.Backend.Redis == nil {
				p.add("%s: rateLimit.backend is not Redis", d.where)
			}
		case *egv1a1.BackendTrafficPolicy:
			if rl := o.Spec.RateLimit; rl == nil || rl.Global == nil || len(rl.Global.Rules) == 0 {
				p.add("%s: no global rate limit rule", d.where)
			}
		case *egv1a1.SecurityPolicy:
			ea := o.Spec.ExtAuth
			if ea == nil || ea.GRPC == nil || len(ea.GRPC.BackendRefs) != 1 {
				p.add("%s: extAuth.grpc with one backendRef expected", d.where)
				continue
			}
			ref := ea.GRPC.BackendRefs[0]
			if ref.Name != "envoy-ratelimit" || ref.Port == nil || *ref.Port != 8081 {
				p.add("%s: extAuth.grpc.backendRefs[0] is %s:%v, want envoy-ratelimit:8081 (the rate limit Deployment's gRPC port)", d.where, ref.Name, ref.Port)
			}
		}
	}
	for _, k := range []string{"EnvoyGateway", "BackendTrafficPolicy", "SecurityPolicy", "ConfigMap"} {
		if seen[k] == 0 {
			p.add("docs/envoy-gateway.md shows no %s", k)
		}
	}
	p.report(t)
}

// rateLimitContainer is an EnvoyGateway's rate limit container settings.
func rateLimitContainer(eg *egv1a1.EnvoyGateway) *egv1a1.KubernetesContainerSpec {
	if eg.Provider == nil || eg.Provider.Kubernetes == nil || eg.Provider.Kubernetes.RateLimitDeployment == nil {
		return nil
	}
	return eg.Provider.Kubernetes.RateLimitDeployment.Container
}

// Turning on hybrid, as the page shows it: the EnvoyGateway that sets
// EXTAUTHZ_OVERLAY names a file under a volume mount of the container,
// whose volume is a ConfigMap the page shows with that file as a key; and
// that file, laid over Envoy Gateway's environment, passes
// `ratelimit validate`.
func TestEnvoyGatewayOverlay(t *testing.T) {
	docs, p := envoyGatewayDocs(t)
	configMaps := map[string]*corev1.ConfigMap{}
	for _, d := range docs {
		if cm, ok := d.obj.(*corev1.ConfigMap); ok {
			configMaps[cm.Name] = cm
		}
	}
	checked := 0
	for _, d := range docs {
		eg, ok := d.obj.(*egv1a1.EnvoyGateway)
		if !ok {
			continue
		}
		c := rateLimitContainer(eg)
		var overlay string
		for _, e := range c.Env {
			if e.Name == "EXTAUTHZ_OVERLAY" {
				overlay = e.Value
			}
		}
		if overlay == "" {
			continue
		}
		checked++
		var mount *corev1.VolumeMount
		for i, m := range c.VolumeMounts {
			if strings.HasPrefix(overlay, strings.TrimSuffix(m.MountPath, "/")+"/") {
				mount = &c.VolumeMounts[i]
			}
		}
		if mount == nil {
			p.add("%s: EXTAUTHZ_OVERLAY %s is under no volumeMount of the container", d.where, overlay)
			continue
		}
		var cm *corev1.ConfigMap
		if pod := eg.Provider.Kubernetes.RateLimitDeployment.Pod; pod != nil {
			for _, v := range pod.Volumes {
				if v.Name == mount.Name && v.ConfigMap != nil {
					cm = configMaps[v.ConfigMap.Name]
				}
			}
		}
		if cm == nil {
			p.add("%s: the volume %s of EXTAUTHZ_OVERLAY is not a ConfigMap the page shows", d.where, mount.Name)
			continue
		}
		key := path.Base(overlay)
		data, ok := cm.Data[key]
		if !ok {
			p.add("%s: ConfigMap %s has no key %s (EXTAUTHZ_OVERLAY %s)", d.where, cm.Name, key, overlay)
			continue
		}
		file := filepath.Join(t.TempDir(), key)
		if err := os.WriteFile(file, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := ratelimitValidate(t, []string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir(), "EXTAUTHZ_OVERLAY=" + file})
		if err != nil {
			p.add("%s: ratelimit validate with the overlay of ConfigMap %s: %v\n%s", d.where, cm.Name, err, out)
		}
	}
	if checked == 0 {
		p.add("docs/envoy-gateway.md shows no EnvoyGateway setting EXTAUTHZ_OVERLAY")
	}
	p.report(t)
}
