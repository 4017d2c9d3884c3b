package deploy

import (
	"strings"
	"testing"
)

// The tests below break a shipped file in one way each and check that the
// checks notice, so a check that silently stops checking fails here.

// edit returns text with old replaced by new once, failing t if old is not
// there: a mistake that no longer applies must not pass by accident.
func edit(t *testing.T, text []byte, old, new string) []byte {
	t.Helper()
	if !strings.Contains(string(text), old) {
		t.Fatalf("the file no longer contains %q; update this test", old)
	}
	return []byte(strings.Replace(string(text), old, new, 1))
}

func TestEnvoyChecksCatchMistakes(t *testing.T) {
	type files struct{ envoy, sidecar string }
	plain := files{"envoy/envoy.yaml", "envoy/extauthz.yaml"}
	jwt := files{"envoy/envoy-jwt.yaml", "envoy/extauthz-jwt.yaml"}
	rls := files{"envoy/envoy-ratelimit.yaml", "envoy/extauthz-ratelimit.yaml"}
	http := files{"envoy/envoy-http.yaml", "envoy/extauthz-http.yaml"}
	rlqs := files{"envoy/envoy-rlqs.yaml", "envoy/extauthz-rlqs.yaml"}
	for _, tc := range []struct {
		name       string
		files      files
		inSidecar  bool // edit the extauthz config, not the bootstrap
		old, new   string
		want       string // in a problem, or in the load error
		loadFailed bool
	}{
		{name: "cluster port", files: plain, old: "port_value: 9001", new: "port_value: 9002",
			want: "sends Checks to 127.0.0.1:9002, but extauthz listens on 127.0.0.1:9001"},
		{name: "sidecar address", files: plain, inSidecar: true, old: "grpc: 127.0.0.1:9001", new: "grpc: 10.1.2.3:9001",
			want: "but extauthz listens on 10.1.2.3:9001"},
		{name: "HTTP/1 cluster", files: plain, old: "http2_protocol_options: {}", new: "http_protocol_options: {}",
			want: "is not HTTP/2"},
		{name: "implicit failure mode", files: plain, old: "failure_mode_allow: false", new: "",
			want: "state failure_mode_allow explicitly"},
		{name: "long timeout", files: plain, old: "timeout: 0.2s", new: "timeout: 2s",
			want: "grpc_service.timeout is 2s"},
		{name: "default status on error", files: plain, old: "status_on_error: {code: ServiceUnavailable}", new: "",
			want: "status_on_error is 0"},
		{name: "request body", files: plain, old: "transport_api_version: V3", new: "transport_api_version: V3\n                      with_request_body: {max_request_bytes: 1024}",
			want: "with_request_body is set"},
		{name: "context typo", files: plain, old: "context_extensions: {route: orders}", new: "context_extensions: {route: order}",
			want: "select no extauthz policy"},
		{name: "context policy unused", files: plain, old: "context_extensions: {route: orders}", new: "context_extensions: {route: order}",
			want: "matches context map[route:orders], which no route sends"},
		{name: "health check checked", files: plain, old: "disabled: true", new: "disabled: false",
			want: "no health-check route with ExtAuthzPerRoute disabled"},
		{name: "per-route filter typo", files: plain, old: "typed_per_filter_config:\n                            envoy.filters.http.ext_authz:", new: "typed_per_filter_config:\n                            envoy.filters.http.extauthz:",
			want: `configures filter "envoy.filters.http.extauthz", which is not in the filter chain`},
		{name: "admin exposed", files: plain, old: "address: 127.0.0.1, port_value: 9901", new: "address: 0.0.0.0, port_value: 9901",
			want: "admin API must stay on loopback"},
		{name: "unknown field", files: plain, old: "failure_mode_allow: false", new: "failure_mode_alow: false",
			want: "unknown field", loadFailed: true},
		{name: "unresolvable type", files: plain, old: "router.v3.Router", new: "router.v3.Routr",
			want: "router.v3.Routr", loadFailed: true},
		{name: "ValidateAll", files: plain, old: "connect_timeout: 0.25s", new: "connect_timeout: 0s",
			want: "ConnectTimeout", loadFailed: true},
		{name: "stat prefix", files: plain, old: "transport_api_version: V3", new: "transport_api_version: V3\n                      stat_prefix: authz",
			want: `stat_prefix "authz" renames its counters`},
		{name: "no request id in the access log", files: plain, old: `request_id: "%REQ(X-REQUEST-ID)%"`, new: "",
			want: "does not print %REQ(X-REQUEST-ID)%"},
		{name: "request ids off", files: jwt, old: "generate_request_id: true", new: "generate_request_id: false",
			want: "generate_request_id is off"},
		{name: "small circuit breaker", files: plain, old: "max_requests: 1024", new: "max_requests: 100",
			want: "max_requests 100 is below the 1000 Checks in flight"},
		{name: "no circuit breaker", files: jwt, old: "max_pending_requests: 1024", new: "",
			want: "set circuit_breakers max_requests and max_pending_requests"},
		{name: "no heap action", files: plain, old: "name: envoy.overload_actions.shrink_heap", new: "name: envoy.overload_actions.reduce_timeouts",
			want: "no envoy.overload_actions.shrink_heap action"},
		{name: "no heap monitor", files: jwt, old: "max_heap_size_bytes: 201326592", new: "",
			want: "no envoy.resource_monitors.fixed_heap monitor"},
		{name: "unbounded connection buffers", files: plain, old: "per_connection_buffer_limit_bytes: 32768\n      filter_chains:", new: "filter_chains:",
			want: "listener ingress: set per_connection_buffer_limit_bytes"},
		{name: "whole admin API exposed", files: plain, old: "match: {path: /stats/prometheus}", new: "match: {prefix: /}",
			want: "the admin API is reachable beyond loopback"},
		{name: "claims not forwarded", files: jwt, old: "metadata_context_namespaces: [envoy.filters.http.jwt_authn]", new: "",
			want: "metadata_context_namespaces lacks envoy.filters.http.jwt_authn"},
		{name: "bearer keys with JWTs", files: jwt, inSidecar: true, old: "bearer: false", new: "bearer: true",
			want: "does not set clients.bearer: false"},
		{name: "no payload in metadata", files: jwt, old: "payload_in_metadata: jwt_payload", new: "",
			want: "has no payload_in_metadata"},
		{name: "rate limit domain", files: rls, old: "domain: edge", new: "domain: egde",
			want: `ratelimit filter domain "egde" is defined by no descriptor file`},
		{name: "rate limit descriptor key", files: rls, old: "descriptor_key: user", new: "descriptor_key: users",
			want: "which no rate limit of domain edge describes"},
		{name: "rate limit descriptor value", files: rls, old: "generic_key: {descriptor_value: api}", new: "generic_key: {descriptor_value: apis}",
			want: "sends descriptor [{generic_key apis} {user }]"},
		{name: "rate limit failure mode", files: rls, old: "failure_mode_deny: false", new: "",
			want: "state failure_mode_deny explicitly"},
		{name: "rate limit timeout", files: rls, old: "timeout: 0.2s", new: "",
			want: "ratelimit filter timeout is 0s"},
		{name: "rate limit cluster port", files: rls, old: "port_value: 9001", new: "port_value: 9002",
			want: "sends Checks to 127.0.0.1:9002"},
		{name: "rate limited health checks", files: rls, old: "match: {path: /healthz}\n                          route: {cluster: app}",
			new:  "match: {path: /healthz}\n                          route: {cluster: app, rate_limits: [{actions: [{remote_address: {}}]}]}",
			want: `health-check route "health" has rate_limits`},
		{name: "rate limit sidecar without the domain", files: rls, inSidecar: true, old: "domains: [ratelimit-edge.yaml]", new: "domains: []",
			want: `ratelimit filter domain "edge" is defined by no descriptor file`},
		{name: "rlqs domain", files: rlqs, old: "domain: edge", new: "domain: egde",
			want: `the rate_limit_quota filter's domain "egde" is not one of extauthz's rlqs.domains`},
		{name: "rlqs allows without an assignment", files: rlqs, old: "fallback_rate_limit: {blanket_rule: DENY_ALL}", new: "fallback_rate_limit: {blanket_rule: ALLOW_ALL}",
			want: "no_assignment_behavior is not DENY_ALL"},
		{name: "rlqs reports too rarely", files: rlqs, old: "reporting_interval: 1s", new: "reporting_interval: 5s",
			want: "reporting_interval 5s is not shorter than extauthz's rlqs.assignment_ttl 3s"},
		{name: "rlqs bucket unmapped", files: rlqs, old: "name: {string_value: orders}", new: "name: {string_value: order}",
			want: "that no rule of extauthz's domain \"edge\" maps"},
		{name: "rlqs cluster port", files: rlqs, old: "port_value: 9001", new: "port_value: 9002",
			want: "sends Checks to 127.0.0.1:9002"},
		{name: "http_service port", files: http, old: "port_value: 9002", new: "port_value: 9001",
			want: "sends auth requests to 127.0.0.1:9001, but extauthz's HTTP door listens on 127.0.0.1:9002"},
		{name: "no HTTP door", files: http, inSidecar: true, old: "http: 127.0.0.1:9002", new: "",
			want: "the extauthz config has no listen.http"},
		{name: "http_service path prefix", files: http, old: "path_prefix: /envoy", new: "path_prefix: /auth",
			want: `path_prefix is "/auth", want /envoy`},
		{name: "http_service HTTP/2", files: http, old: "      # HTTP/1.1 with keep-alive", new: "      typed_extension_protocol_options:\n        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\n          \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions\n          explicit_http_config:\n            http2_protocol_options: {}\n      # HTTP/1.1 with keep-alive",
			want: "is HTTP/2; the HTTP door speaks HTTP/1.1"},
		{name: "http_service long timeout", files: http, old: "timeout: 0.3s", new: "timeout: 3s",
			want: "http_service.server_uri.timeout is 3s"},
		{name: "key header not sent", files: http, old: "patterns: [{exact: x-api-key}, {exact: x-forwarded-for}]", new: "patterns: [{exact: x-forwarded-for}]",
			want: "allowed_headers lacks x-api-key"},
		{name: "header key not sent", files: http, inSidecar: true, old: "key: [client]\n    limit: 2", new: "key: [client, header:x-tenant]\n    limit: 2",
			want: "allowed_headers lacks x-tenant"},
		{name: "client id not passed", files: http, old: "patterns: [{exact: x-client-id}]", new: "patterns: [{exact: x-client}]",
			want: "allowed_upstream_headers lacks x-client-id"},
		{name: "limits not shown", files: http, old: "patterns: [{exact: ratelimit-policy}, {exact: ratelimit}]", new: "patterns: [{exact: ratelimit}]",
			want: "allowed_client_headers_on_success lacks ratelimit-policy"},
		{name: "context over http", files: http, inSidecar: true, old: "path_prefix: /orders\n", new: "path_prefix: /orders\n      context: {route: orders}\n",
			want: "matches context_extensions, which Envoy sends gRPC authorization servers only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			envoyText := readFile(t, repoPath(t, tc.files.envoy))
			sidecarText := readFile(t, repoPath(t, tc.files.sidecar))
			if tc.inSidecar {
				sidecarText = edit(t, sidecarText, tc.old, tc.new)
			} else {
				envoyText = edit(t, envoyText, tc.old, tc.new)
			}
			b, err := loadBootstrap(envoyText)
			if tc.loadFailed {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("load error %v, want one mentioning %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			sc, err := parseSidecarConfig(sidecarText)
			if err != nil {
				t.Fatal(err)
			}
			if err := sc.loadDomains(map[string][]byte{"ratelimit-edge.yaml": readFile(t, repoPath(t, "envoy/ratelimit-edge.yaml"))}); err != nil {
				t.Fatal(err)
			}
			var p problems
			checkBootstrap(&p, tc.files.envoy, envoyText, b, sc)
			if !p.has(tc.want) {
				t.Errorf("no problem mentions %q; got %q", tc.want, p.list)
			}
		})
	}
}

func TestManifestChecksCatchMistakes(t *testing.T) {
	for _, tc := range []struct {
		name, set, file string
		old, new        string
		want            string
	}{
		{"unknown field", "sidecar", "k8s/sidecar/deployment.yaml",
			"readOnlyRootFilesystem: true", "readOnlyRootFileSystem: true", `unknown field "spec.template.spec.initContainers[0].securityContext.readOnlyRootFileSystem"`},
		{"duplicate field", "sidecar", "k8s/sidecar/service.yaml",
			"  selector:\n", "  type: ClusterIP\n  type: NodePort\n  selector:\n", `key "type" already set`},
		{"probe port", "sidecar", "k8s/sidecar/deployment.yaml",
			"startupProbe:\n            httpGet: {path: /readyz, port: admin}", "startupProbe:\n            httpGet: {path: /readyz, port: 9091}", "startupProbe points at a port the container does not declare"},
		{"readiness that ignores draining", "sidecar", "k8s/sidecar/deployment.yaml",
			"readinessProbe:\n            httpGet: {path: /readyz, port: admin}", "readinessProbe:\n            httpGet: {path: /healthz, port: admin}", "readinessProbe must be httpGet /readyz on the admin port 9090"},
		{"gRPC probe of a loopback Check port", "sidecar", "k8s/sidecar/deployment.yaml",
			"readinessProbe:\n            httpGet: {path: /readyz, port: admin}", "readinessProbe:\n            grpc: {port: 9001, service: envoy.service.auth.v3.Authorization}", "listens there on 127.0.0.1 only; the kubelet connects to the pod IP"},
		{"secret key", "sidecar", "k8s/sidecar/deployment.yaml",
			"secretKeyRef: {name: extauthz-redis, key: password}", "secretKeyRef: {name: extauthz-redis, key: passwd}", "Secret extauthz-redis has no key passwd"},
		{"replica id", "sidecar", "k8s/sidecar/deployment.yaml",
			"fieldRef: {fieldPath: metadata.name}", "fieldRef: {fieldPath: metadata.namespace}", "EXTAUTHZ_REPLICA_ID must come from the downward API"},
		{"GOMAXPROCS without a limit", "sidecar", "k8s/sidecar/deployment.yaml",
			`limits: {cpu: "2", memory: 256Mi}   # local.max_keys`, `limits: {memory: 256Mi}   # local.max_keys`, "env GOMAXPROCS reads limits.cpu, but the container sets no such limit"},
		{"undefined $(VAR)", "sidecar", "k8s/sidecar/deployment.yaml",
			"- $(ENVOY_CONCURRENCY)", "- $(ENVOY_WORKERS)", "refers to $(ENVOY_WORKERS)"},
		{"root filesystem writable", "sidecar", "k8s/sidecar/deployment.yaml",
			"readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", "readOnlyRootFilesystem must be true"},
		{"latest image", "sidecar", "k8s/sidecar/deployment.yaml",
			"image: envoyproxy/envoy:v1.40.0", "image: envoyproxy/envoy:latest", "pin a version"},
		{"probe on loopback", "sidecar", "k8s/sidecar/extauthz-config.yaml",
			"admin: 0.0.0.0:9090", "admin: 127.0.0.1:9090", "the kubelet connects to the pod IP"},
		{"Check port on the pod IP", "sidecar", "k8s/sidecar/extauthz-config.yaml",
			"grpc: 127.0.0.1:9001", "grpc: 0.0.0.0:9001", "extauthz must listen on loopback (or a unix socket), not rely on a NetworkPolicy"},
		{"Istio same-pod Check port on the pod IP", "istio-same-pod", "k8s/istio/same-pod/extauthz-config.yaml",
			"grpc: 127.0.0.1:9001", "grpc: 0.0.0.0:9001", "extauthz must listen on loopback (or a unix socket), not rely on a NetworkPolicy"},
		{"invalid extauthz config", "sidecar", "k8s/sidecar/extauthz-config.yaml",
			"algorithm: token_bucket", "algorithm: token_bukket", "extauthz validate"},
		{"Envoy calls the wrong port", "sidecar", "k8s/sidecar/envoy-config.yaml",
			"port_value: 9001", "port_value: 9002", "sends Checks to 127.0.0.1:9002"},
		{"Envoy's app port", "sidecar", "k8s/sidecar/envoy-config.yaml",
			"port_value: 8081", "port_value: 8082", "cluster app goes to 127.0.0.1:8082, which no container in the pod declares"},
		{"subPath mount", "sidecar", "k8s/sidecar/deployment.yaml",
			"{name: extauthz-config, mountPath: /etc/extauthz, readOnly: true}", "{name: extauthz-config, mountPath: /etc/extauthz/extauthz.yaml, subPath: extauthz.yaml, readOnly: true}", "with subPath"},
		{"Service target", "sidecar", "k8s/sidecar/service.yaml",
			"targetPort: http", "targetPort: htp", "targets htp, which no container declares"},
		{"PDB blocks drains", "sidecar", "k8s/sidecar/pdb.yaml",
			"maxUnavailable: 1", "minAvailable: 2", "blocks every drain"},
		{"Istio spec unknown field", "istio-same-pod", "k8s/istio/same-pod/authorizationpolicy.yaml",
			"notPaths:", "notPath:", `unknown field "notPath"`},
		{"Istio provider", "istio-same-pod", "k8s/istio/same-pod/authorizationpolicy.yaml",
			"name: extauthz-local", "name: extauthz-locl", `provider "extauthz-locl" is not an envoyExtAuthzGrpc provider`},
		{"ServiceEntry port", "istio-same-pod", "k8s/istio/same-pod/serviceentry.yaml",
			"number: 9001", "number: 9002", "has no GRPC port 9001"},
		{"shared Service port", "istio-shared", "k8s/istio/shared/extauthz.yaml",
			"targetPort: grpc, appProtocol: grpc", "targetPort: admin, appProtocol: grpc", "does not reach extauthz's listen.grpc"},
		{"Istio probes deadlock", "istio-same-pod", "k8s/istio/same-pod/deployment.yaml",
			`sidecar.istio.io/nativeSidecar: "true"`, `sidecar.istio.io/nativeSidecar: "false"`, "without sidecar.istio.io/nativeSidecar"},
		{"shared: no native sidecar", "istio-shared", "k8s/istio/shared/extauthz.yaml",
			`sidecar.istio.io/nativeSidecar: "true"`, ``, "without sidecar.istio.io/nativeSidecar"},
		{"Envoy heap above its memory limit", "sidecar", "k8s/sidecar/envoy-config.yaml",
			"max_heap_size_bytes: 201326592", "max_heap_size_bytes: 536870912", "is not below the container's memory limit"},
		{"shared extauthz open", "istio-shared", "k8s/istio/shared/security.yaml",
			"action: ALLOW", "action: AUDIT", "a shared extauthz needs an Istio ALLOW AuthorizationPolicy"},
		{"EnvoyFilter domain", "istio-ratelimit", "k8s/istio/ratelimit/envoyfilter.yaml",
			"domain: mesh", "domain: mseh", `ratelimit filter domain "mseh" is defined by no descriptor file`},
		{"EnvoyFilter service", "istio-ratelimit", "k8s/istio/ratelimit/envoyfilter.yaml",
			"cluster_name: outbound|9001||extauthz.extauthz.svc.cluster.local", "cluster_name: outbound|9001||ratelimit.extauthz.svc.cluster.local",
			"apply set istio-ratelimit has no Service ratelimit in namespace extauthz"},
		{"EnvoyFilter port", "istio-ratelimit", "k8s/istio/ratelimit/envoyfilter.yaml",
			"cluster_name: outbound|9001||", "cluster_name: outbound|8081||", "Service extauthz has no port 8081"},
		{"EnvoyFilter descriptor key", "istio-ratelimit", "k8s/istio/ratelimit/envoyfilter.yaml",
			"descriptor_key: user}", "descriptor_key: uid}", "which no rate limit of domain mesh describes"},
		{"EnvoyFilter selector", "istio-ratelimit", "k8s/istio/ratelimit/envoyfilter.yaml",
			"app.kubernetes.io/name: demo-api-shared\n  configPatches:\n    - applyTo: HTTP_FILTER", "app.kubernetes.io/name: demo-api\n  configPatches:\n    - applyTo: HTTP_FILTER",
			"workloadSelector map[app.kubernetes.io/name:demo-api] matches no Deployment"},
		{"EnvoyFilter failure mode", "istio-ratelimit", "k8s/istio/ratelimit/envoyfilter.yaml",
			"failure_mode_deny: false", "", "state failure_mode_deny explicitly"},
		{"EnvoyFilter ValidateAll", "istio-ratelimit", "k8s/istio/ratelimit/envoyfilter.yaml",
			"transport_api_version: V3", "transport_api_version: V2", "transport_api_version"},
		{"descriptor file not in the ConfigMap", "istio-ratelimit", "k8s/istio/shared/extauthz.yaml",
			"domains: [ratelimit-mesh.yaml]", "domains: [ratelimit-mash.yaml]", "extauthz validate"},
		{"shared extauthz open to the mesh", "istio-shared", "k8s/istio/shared/security.yaml",
			"source: {namespaces: [demo]}", `source: {principals: ["*"]}`, "rule 0 admits any mesh identity to port 9001"},
		{"shared extauthz without a from", "istio-shared", "k8s/istio/shared/security.yaml",
			"    - from:\n        - source: {namespaces: [demo]}\n      to:", "    - to:", "rule 0 admits any caller to port 9001"},
		{"shared extauthz without mTLS", "istio-shared", "k8s/istio/shared/security.yaml",
			"mode: STRICT", "mode: PERMISSIVE", "a shared extauthz needs mTLS on its gRPC port 9001"},
		{"shared extauthz with mTLS relaxed on its port", "istio-shared", "k8s/istio/shared/security.yaml",
			"9090: {mode: PERMISSIVE}", "9001: {mode: PERMISSIVE}", "a shared extauthz needs mTLS on its gRPC port 9001"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := manifestFiles(t)
			files[tc.file] = edit(t, files[tc.file], tc.old, tc.new)
			objs, errs := decodeFiles(files)
			var p problems
			for _, err := range errs {
				p.add("%v", err)
			}
			checkSet(&p, buildSet(&p, objs, tc.set), loadMeshConfig(t))
			if !p.has(tc.want) {
				t.Errorf("no problem mentions %q; got %q", tc.want, p.list)
			}
		})
	}
}

func TestDockerfileChecksCatchMistakes(t *testing.T) {
	root := repoRoot(t)
	for _, tc := range []struct{ name, old, new, want string }{
		{"cgo", "CGO_ENABLED=0 GOOS", "CGO_ENABLED=1 GOOS", "want CGO_ENABLED=0"},
		{"package", "/out/extauthz ./cmd/extauthz", "/out/extauthz ./cmd/other", `compiles "./cmd/other"`},
		{"root", "USER 65532:65532", "USER root", `USER "root"`},
		{"no user", "USER 65532:65532", "", `USER ""`},
		{"old Go", "ARG GO_VERSION=1.26.8", "ARG GO_VERSION=1.21", "uses Go 1.21"},
		{"fat base", "FROM gcr.io/distroless/static:nonroot", "FROM debian:13", "want scratch or gcr.io/distroless/static"},
		{"entrypoint", `ENTRYPOINT ["/extauthz"]`, `ENTRYPOINT ["/bin/extauthz"]`, "is not the binary built"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			text := edit(t, readFile(t, repoPath(t, "Dockerfile")), tc.old, tc.new)
			d, err := parseDockerfileText(text)
			if err != nil {
				t.Fatal(err)
			}
			var p problems
			checkDockerfile(&p, d, goModVersion(t, root))
			if !p.has(tc.want) {
				t.Errorf("no problem mentions %q; got %q", tc.want, p.list)
			}
		})
	}
}

func TestMeshConfigChecksCatchMistakes(t *testing.T) {
	for _, tc := range []struct{ name, old, new, want string }{
		{"unknown field", "failOpen: false\n        # When", "failOpn: false\n        # When", "unknown field"},
		{"implicit failOpen", "failOpen: false\n        # When", "# When", "state failOpen explicitly"},
		{"slow", "timeout: 0.2s\n        # Fail", "timeout: 5s\n        # Fail", "timeout 5s"},
		{"ext_authz stats dropped", `- ".*ext_authz.*"`, `- ".*ext_auth$"`, "does not export http.inbound_0.0.0.0_8080.ext_authz.error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			text := edit(t, readFile(t, repoPath(t, meshConfigFile)), tc.old, tc.new)
			m, err := parseMeshConfig(text)
			var p problems
			if err != nil {
				p.add("%v", err)
			} else {
				for name, g := range m.providers {
					checkProvider(&p, name, g, m.explicitFailOpen[name])
				}
				checkStatsMatcher(&p, m.statsMatcher)
			}
			if !p.has(tc.want) {
				t.Errorf("no problem mentions %q; got %q", tc.want, p.list)
			}
		})
	}
}
