package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kind/pkg/apis/config/defaults"
	kindv1alpha4 "sigs.k8s.io/kind/pkg/apis/config/v1alpha4"
	"sigs.k8s.io/yaml"
)

// TestKindCluster decodes kind-cluster.yaml strictly into kind's own
// v1alpha4 Cluster, as `kind create cluster --config` does, and checks its
// port mapping reaches the demo's NodePort.
func TestKindCluster(t *testing.T) {
	var c kindv1alpha4.Cluster
	if err := yaml.UnmarshalStrict(readFile(t, repoPath(t, "kind-cluster.yaml")), &c); err != nil {
		t.Fatalf("kind-cluster.yaml: %v", err)
	}
	if c.Kind != "Cluster" || c.APIVersion != "kind.x-k8s.io/v1alpha4" {
		t.Errorf("kind-cluster.yaml: kind %q apiVersion %q, want Cluster kind.x-k8s.io/v1alpha4", c.Kind, c.APIVersion)
	}
	if len(c.Nodes) == 0 || c.Nodes[0].Role != kindv1alpha4.ControlPlaneRole {
		t.Fatal("kind-cluster.yaml: the first node must be the control plane")
	}
	for i, n := range c.Nodes {
		// The node image kind was released with: other Kubernetes versions
		// may need another kind.
		if n.Image != "" && n.Image != defaults.Image {
			t.Errorf("kind-cluster.yaml: nodes[%d].image %s; the kind in tests/deploy/go.mod was released with %s", i, n.Image, defaults.Image)
		}
	}

	nodePorts := map[int32]bool{}
	for _, o := range loadManifests(t) {
		if svc, ok := o.k8s.(*corev1.Service); ok && svc.Spec.Type == corev1.ServiceTypeNodePort {
			for _, p := range svc.Spec.Ports {
				nodePorts[p.NodePort] = true
			}
		}
	}
	mapped := false
	for _, n := range c.Nodes {
		for _, m := range n.ExtraPortMappings {
			if !nodePorts[m.ContainerPort] {
				t.Errorf("kind-cluster.yaml: maps container port %d, which is no Service's nodePort", m.ContainerPort)
			}
			if m.ListenAddress != "127.0.0.1" {
				t.Errorf("kind-cluster.yaml: port %d listens on %q; keep the demo on 127.0.0.1", m.HostPort, m.ListenAddress)
			}
			mapped = true
		}
	}
	if !mapped {
		t.Error("kind-cluster.yaml: no extraPortMappings: the smoke test could not reach Envoy")
	}
}

// TestKindScripts checks the kind scripts parse (bash -n), are strict, are
// executable, and refer to files that exist.
func TestKindScripts(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	dir := repoPath(t, "scripts/kind")
	files, err := filepath.Glob(filepath.Join(dir, "*.sh"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts in scripts/kind: %v", err)
	}
	rootRef := regexp.MustCompile(`\$ROOT/([A-Za-z0-9_./-]+)`)
	for _, f := range files {
		name := rel(t, f)
		if out, err := exec.Command("bash", "-n", f).CombinedOutput(); err != nil {
			t.Errorf("%s: bash -n: %v\n%s", name, err, out)
		}
		text := string(readFile(t, f))
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		sourced := filepath.Base(f) == "env.sh"
		if !sourced {
			if !strings.HasPrefix(text, "#!/usr/bin/env bash\n") {
				t.Errorf("%s: want #!/usr/bin/env bash", name)
			}
			if !strings.Contains(text, "\nset -euo pipefail\n") {
				t.Errorf("%s: want set -euo pipefail", name)
			}
			if fi.Mode()&0o111 == 0 {
				t.Errorf("%s: not executable", name)
			}
		}
		for _, m := range rootRef.FindAllStringSubmatch(text, -1) {
			if _, err := os.Stat(repoPath(t, m[1])); err != nil {
				t.Errorf("%s: refers to $ROOT/%s, which does not exist", name, m[1])
			}
		}
	}
	// shellcheck where installed (apt-get install shellcheck): warnings
	// and errors fail, style notes do not.
	if _, err := exec.LookPath("shellcheck"); err == nil {
		args := append([]string{"-x", "-S", "warning"}, files...)
		cmd := exec.Command("shellcheck", args...)
		cmd.Dir = repoRoot(t)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("shellcheck: %v\n%s", err, out)
		}
	}
}
