// Package deploy checks the files users copy to deploy extauthz: the Envoy
// bootstraps under envoy/, the Kubernetes and Istio manifests under k8s/,
// the Envoy Gateway manifests docs/envoy-gateway.md shows,
// kind-cluster.yaml, the kind scripts and the Dockerfile.
//
// No Envoy, Kubernetes or Docker engine runs in CI, so the tests check each
// file against the real schema instead: Envoy YAML is decoded into
// go-control-plane's Bootstrap with every typed_config resolved and passed
// through the generated ValidateAll; manifests are decoded strictly
// (unknown and duplicate fields fail) into the k8s.io/api, istio.io/api
// and github.com/envoyproxy/gateway/api/v1alpha1 types; kind-cluster.yaml into kind's v1alpha4 Cluster; the Dockerfile is
// parsed by BuildKit's own parser and its go build line is run. Beyond the
// schemas, the tests check what ties the files together: the ext_authz
// cluster points where the paired extauthz config listens, probes point at
// declared ports, mounts and env refer to ConfigMaps, Secrets and keys that
// exist, and every extauthz config passes the real `extauthz validate`.
//
// This is a separate module so the Kubernetes, Istio, Envoy Gateway, kind
// and BuildKit dependencies stay out of the product's go.mod. Run it with
//
//	cd tests/deploy && go test ./...
package deploy
