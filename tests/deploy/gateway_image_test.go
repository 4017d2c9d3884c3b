package deploy

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
)

// envoyGatewayEnv is the environment Envoy Gateway's rate-limit
// Deployment sets by default (its internal/infrastructure/kubernetes/
// ratelimit), with Redis and Prometheus on.
var envoyGatewayEnv = []string{
	"RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_IGNOREDOTFILES=true", "RUNTIME_WATCH_ROOT=false",
	"LOG_LEVEL=info", "USE_STATSD=false", "CONFIG_TYPE=GRPC_XDS_SOTW",
	"CONFIG_GRPC_XDS_SERVER_URL=envoy-gateway:18001", "CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit",
	"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=/certs/tls.crt", "GRPC_SERVER_TLS_KEY=/certs/tls.key", "GRPC_SERVER_TLS_CA_CERT=/certs/ca.crt",
	"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT=/certs/tls.crt", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY=/certs/tls.key",
	"CONFIG_GRPC_XDS_SERVER_TLS_CACERT=/certs/ca.crt", "FORCE_START_WITHOUT_INITIAL_CONFIG=true",
	"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis.redis.svc:6379",
	"USE_PROMETHEUS=true", "PROMETHEUS_ADDR=:19001", "PROMETHEUS_MAPPER_YAML=/etc/statsd-exporter/conf.yaml",
}

// The image ships the binary also as /bin/ratelimit, Envoy Gateway's
// command, and that binary under that name, with the image's ENV and
// Envoy Gateway's environment, reads the anchor's environment: `validate`
// explains it and accepts it.
func TestImageShipsRatelimit(t *testing.T) {
	d, err := parseDockerfile(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	gb, err := d.findGoBuild(runtime.GOARCH)
	if err != nil {
		t.Fatal(err)
	}
	final := d.stages[len(d.stages)-1]
	env := []string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir()}
	shipped := false
	for _, c := range final.Commands {
		switch c := c.(type) {
		case *instructions.CopyCommand:
			if c.From == gb.stage.Name && len(c.SourcePaths) == 1 && c.SourcePaths[0] == gb.output && c.DestPath == "/bin/ratelimit" {
				shipped = true
			}
		case *instructions.EnvCommand:
			for _, kv := range c.Env {
				env = append(env, kv.Key+"="+kv.Value)
			}
		}
	}
	if !shipped {
		t.Fatalf("Dockerfile: the final stage does not copy the binary built at %s to /bin/ratelimit, the command Envoy Gateway runs", gb.output)
	}
	out, err := ratelimitValidate(t, env)
	if err != nil {
		t.Fatalf("ratelimit validate under Envoy Gateway's environment: %v\n%s", err, out)
	}
	for _, want := range []string{
		"descriptors over xDS from envoy-gateway:18001 (node envoy-ratelimit, TLS 1.3 with a client certificate); serves at once",
		"gRPC (rate limit service, Check, health) on 0.0.0.0:8081 over TLS, client certificates required",
		"/healthcheck, /healthz, /readyz, /metrics on 0.0.0.0:8080",
		"counts in Redis at redis.redis.svc:6379",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("validate did not say %q:\n%s", want, out)
		}
	}
}

// ratelimitValidate runs the binary as /bin/ratelimit validate with env
// and then Envoy Gateway's default environment, its /certs files
// replaced by files of the test's own (validate reads them).
func ratelimitValidate(t *testing.T, env []string) ([]byte, error) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ratelimit")
	data, err := os.ReadFile(extauthzBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	certs := t.TempDir()
	for _, f := range []string{"tls.crt", "tls.key", "ca.crt"} {
		if err := os.WriteFile(filepath.Join(certs, f), []byte("placeholder"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	env = append(env, envoyGatewayEnv...)
	env = append(env, "GRPC_SERVER_TLS_CERT="+filepath.Join(certs, "tls.crt"), "GRPC_SERVER_TLS_KEY="+filepath.Join(certs, "tls.key"),
		"GRPC_SERVER_TLS_CA_CERT="+filepath.Join(certs, "ca.crt"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "validate")
	cmd.Env, cmd.Dir = env, t.TempDir()
	return cmd.CombinedOutput()
}
