package tests

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/extauthz/extauthz/tests/internal/testcerts"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// Envoy Gateway runs the rate limit service as /bin/ratelimit, with no
// arguments, configured by envoyproxy/ratelimit's environment alone
// (internal/infrastructure/kubernetes/ratelimit in envoyproxy/gateway).
// These tests run the real binary that way: under the name ratelimit,
// with that environment, on loopback.

// gatewayDomain is a listener domain as Envoy Gateway's translator writes
// it for a route rule with no match (descriptor chain
// httproute/<ns>/<name>/rule/<i>/match/<j>, then rule-<i>-match-<j>) and
// every field its YAML carries, quota_mode, value_to_metric and
// share_threshold among them; plus a quota-mode rule. Hour windows: a
// test's few requests never cross one's end but at the top of an hour.
const gatewayDomain = `name: default/eg/http
domain: default/eg/http
descriptors:
  - key: httproute/default/backend/rule/0/match/-1
    value: httproute/default/backend/rule/0/match/-1
    rate_limit: null
    descriptors:
      - key: rule-0-match--1
        value: rule-0-match--1
        rate_limit:
          requests_per_unit: 3
          unit: HOUR
          unlimited: false
          name: ""
          replaces: []
        descriptors: []
        shadow_mode: false
        quota_mode: false
        detailed_metric: false
        value_to_metric: false
        share_threshold: false
    shadow_mode: false
    quota_mode: false
    detailed_metric: false
    value_to_metric: false
    share_threshold: false
  - key: soft
    quota_mode: true
    rate_limit: {requests_per_unit: 1, unit: HOUR}
`

// routeRule is the descriptor Envoy sends for rule 0 of route
// default/backend.
func routeRule() *ratelimitv3.RateLimitDescriptor {
	return gwDescriptor("httproute/default/backend/rule/0/match/-1", "httproute/default/backend/rule/0/match/-1", "rule-0-match--1", "rule-0-match--1")
}

func gwDescriptor(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// ratelimitBinary is the test binary under the name Envoy Gateway starts
// it by, as the image ships it (a link).
func ratelimitBinary(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ratelimit")
	must(t, os.Symlink(binary, path))
	return path
}

// loopbackEnv is what every test sets: loopback listeners on ports the
// kernel picks (the anchor's defaults are 0.0.0.0), JSON logs to read the
// addresses from, and statsd off (as Envoy Gateway sets it).
func loopbackEnv() []string {
	return []string{"HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "LOG_FORMAT=json", "LOG_LEVEL=info", "USE_STATSD=false"}
}

// runtimeDir writes the descriptor files under RUNTIME_ROOT/ratelimit/config
// and returns the variables naming them.
func runtimeDir(t *testing.T, files map[string]string) []string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	must(t, os.MkdirAll(dir, 0o755))
	for name, content := range files {
		must(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600))
	}
	return []string{"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_IGNOREDOTFILES=true", "RUNTIME_WATCH_ROOT=false"}
}

// ratelimitProc is the binary started as ratelimit.
type ratelimitProc struct {
	*sidecar
	Prometheus string // host:port; "" without USE_PROMETHEUS
}

// startRatelimit starts bin with no arguments under env (after the test
// process's own) and waits for it to serve; creds dials its gRPC door
// (nil: plaintext). It is startProcess for a process configured by
// environment alone.
func startRatelimit(t *testing.T, bin string, creds credentials.TransportCredentials, env ...string) *ratelimitProc {
	t.Helper()
	s, ready := spawnRatelimit(t, bin, env...)
	rec := s.await(ready, creds)
	p := &ratelimitProc{sidecar: s}
	p.Prometheus, _ = rec["prometheus"].(string)
	return p
}

// spawnRatelimit starts bin as startRatelimit does, without waiting for
// it to serve.
func spawnRatelimit(t *testing.T, bin string, env ...string) (*sidecar, <-chan map[string]any) {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), env...)
	return spawn(t, cmd, "ratelimit")
}

// runRatelimit runs bin with args under env to its end: its exit code and
// output.
func runRatelimit(t *testing.T, bin string, env []string, args ...string) (int, string, string) {
	t.Helper()
	// A process that serves instead of refusing would never end: it is
	// stopped after 20s, and the test fails saying so.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %v did not end within 20s (it served?):\n%s", bin, args, tail(stderr.String(), 10))
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, stdout.String(), stderr.String()
}

// ask sends one request of the descriptors ds for domain.
func (s *sidecar) ask(domain string, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	s.t.Helper()
	return s.shouldRateLimit(&rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
}

// healthcheck asks GET /healthcheck on the HTTP listener, as Envoy
// Gateway's probes do.
func healthcheck(t *testing.T, addr string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/healthcheck")
	must(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// Started as ratelimit with Envoy Gateway's environment (FILE, Redis
// over tcp, Prometheus on), the binary serves the descriptors of the
// runtime directory in Redis, exactly: a rule of 3 an hour admits 3; the
// quota-mode rule never denies and reports its violation in the dynamic
// metadata; the anchor's limit headers are sent; /healthcheck answers OK
// on HOST:PORT; a variable nobody knows is ignored.
func TestRatelimitEnvFile(t *testing.T) {
	parallel(t)
	srv := testredis.Start(t)
	env := append(loopbackEnv(), runtimeDir(t, map[string]string{"default-eg-http.yaml": gatewayDomain})...)
	env = append(env, "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+srv.Addr, "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:0",
		"RESPONSE_DYNAMIC_METADATA=true", "LIMIT_RESPONSE_HEADERS_ENABLED=true", "NOBODY_KNOWS_THIS_ONE=1")
	p := startRatelimit(t, ratelimitBinary(t), nil, env...)

	if code, body := healthcheck(t, p.Admin); code != http.StatusOK || body != "OK" {
		t.Fatalf("/healthcheck = %d %q, want 200 OK", code, body)
	}
	const domain = "default/eg/http"
	admitted := 0
	for i := 0; i < 5; i++ {
		if p.ask(domain, routeRule()).GetOverallCode() == rlsv3.RateLimitResponse_OK {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("the route rule of 3 an hour admitted %d of 5, want 3", admitted)
	}
	// Counted in Redis, under the anchor-configured Redis.
	if n := srv.Client().DBSize(context.Background()).Val(); n == 0 {
		t.Fatal("no key in Redis: the counts are not where REDIS_URL says")
	}
	resp := p.ask(domain, routeRule())
	if got := headerOf(resp, "RateLimit-Limit"); got != "3" || headerOf(resp, "RateLimit-Remaining") != "0" {
		t.Fatalf("limit headers: RateLimit-Limit %q, Remaining %q; want 3 and 0 (%v)", got, headerOf(resp, "RateLimit-Remaining"), resp)
	}
	p.ask(domain, gwDescriptor("soft", "x"))
	resp = p.ask(domain, gwDescriptor("soft", "x"))
	v := resp.GetDynamicMetadata().GetFields()["quotaModeViolations"].GetListValue().GetValues()
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(v) != 1 || v[0].GetNumberValue() != 0 {
		t.Fatalf("the quota-mode rule over its 1 an hour: want OK with violation [0]; got %v", resp)
	}
}

// What the anchor reads but extauthz cannot do stops the start-up with
// the variable's name; a bad value likewise.
func TestRatelimitEnvRefusesWhatItCannotHonour(t *testing.T) {
	parallel(t)
	bin := ratelimitBinary(t)
	base := append(loopbackEnv(), runtimeDir(t, map[string]string{"d.yaml": gatewayDomain})...)
	for _, c := range []struct {
		set, want string
	}{
		{"BACKEND_TYPE=memcache", `BACKEND_TYPE: "memcache": extauthz keeps counts in Redis`},
		{"USE_STATSD=true", `USE_STATSD: is "true", but extauthz does not send statsd`},
		{"REDIS_PERSECOND=true", "REDIS_PERSECOND: is \"true\""},
		{"MERGE_DOMAIN_CONFIG=true", "MERGE_DOMAIN_CONFIG: is \"true\""},
		{"CONFIG_TYPE=REST", `CONFIG_TYPE: "REST" is not a configuration type`},
		{"GRPC_PORT=eighty", `GRPC_PORT: "eighty" is not a whole number`},
	} {
		t.Run(c.set, func(t *testing.T) {
			code, _, stderr := runRatelimit(t, bin, append(base, c.set))
			if code != 1 || !strings.Contains(stderr, c.want) {
				t.Fatalf("exit %d, stderr:\n%s\nwant exit 1 and %q", code, stderr, c.want)
			}
		})
	}
}

// `ratelimit validate` explains the environment it would run with and
// checks the descriptor files; CONFIG_TYPE set makes `extauthz validate`
// do the same under its own name.
func TestRatelimitValidateExplains(t *testing.T) {
	parallel(t)
	env := append(loopbackEnv(), runtimeDir(t, map[string]string{"d.yaml": gatewayDomain})...)
	code, stdout, stderr := runRatelimit(t, ratelimitBinary(t), append(env, "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=127.0.0.1:6399", "REDIS_AUTH=s3cret"), "validate")
	for _, want := range []string{
		`GRPC_HOST                                     "127.0.0.1": the gRPC listener's host`,
		`REDIS_AUTH                                    "(set, not shown)"`,
		"counts in Redis at 127.0.0.1:6399",
		"rule-0-match--1=rule-0-match--1  3/hour",
		"soft  ",
	} {
		if code != 0 || !strings.Contains(stdout, want) {
			t.Fatalf("exit %d, stdout:\n%s\nstderr:\n%s\nwant %q", code, stdout, stderr, want)
		}
	}
	if !strings.Contains(stdout, "1/hour  fixed_window  redis  quota") {
		t.Fatalf("the quota-mode rule's flags: stdout:\n%s", stdout)
	}
	if strings.Contains(stdout+stderr, "s3cret") {
		t.Fatal("validate printed REDIS_AUTH's secret")
	}
	code, stdout, _ = runRatelimit(t, binary, append(env, "CONFIG_TYPE=FILE"), "validate")
	if code != 0 || !strings.Contains(stdout, "envoyproxy/ratelimit's environment, as extauthz reads it") {
		t.Fatalf("extauthz validate with CONFIG_TYPE set: exit %d, stdout:\n%s", code, stdout)
	}
}

// GRPC_SERVER_USE_TLS with GRPC_SERVER_TLS_CA_CERT (Envoy Gateway's
// variables): the gRPC door refuses a client without a certificate and
// serves one with a certificate the CA signed; a server certificate
// replaced on disk (a rotated secret) serves the next connection with no
// restart.
func TestRatelimitEnvTLS(t *testing.T) {
	parallel(t)
	certs := testcerts.Write(t, "ratelimit")
	dir := t.TempDir()
	cert, key, ca := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt")
	copyFile(t, certs.ServerCert, cert)
	copyFile(t, certs.ServerKey, key)
	copyFile(t, certs.CA, ca)
	env := append(loopbackEnv(), runtimeDir(t, map[string]string{"d.yaml": gatewayDomain})...)
	env = append(env, "GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT="+cert, "GRPC_SERVER_TLS_KEY="+key, "GRPC_SERVER_TLS_CA_CERT="+ca)
	withCert := clientTLS(t, certs.CA, certs.ClientCert, certs.ClientKey)
	p := startRatelimit(t, ratelimitBinary(t), withCert, env...)
	if resp := p.ask("default/eg/http", routeRule()); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("a client with a certificate: %v", resp)
	}
	if err := callOnce(p.GRPC, clientTLS(t, certs.CA, "", "")); err == nil {
		t.Fatal("a client without a certificate was served; GRPC_SERVER_TLS_CA_CERT requires one")
	}

	// Rotation: a server certificate of another CA replaces the files; a
	// client that trusts only the new CA is served on its next connection.
	next := testcerts.Write(t, "rotated")
	copyFile(t, next.ServerCert, cert)
	copyFile(t, next.ServerKey, key)
	copyFile(t, next.CA, ca)
	if err := callOnce(p.GRPC, clientTLS(t, next.CA, next.ClientCert, next.ClientKey)); err != nil {
		t.Fatalf("after the certificates were replaced on disk, a client of the new CA: %v", err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	must(t, err)
	// Written aside and renamed, as Kubernetes swaps a secret's files.
	tmp := to + ".tmp"
	must(t, os.WriteFile(tmp, data, 0o600))
	must(t, os.Rename(tmp, to))
}

// clientTLS trusts ca and shows the client certificate when given.
func clientTLS(t *testing.T, ca, cert, key string) credentials.TransportCredentials {
	t.Helper()
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: "localhost"}
	pool, err := loadCAPool(ca)
	must(t, err)
	tc.RootCAs = pool
	if cert != "" {
		c, err := tls.LoadX509KeyPair(cert, key)
		must(t, err)
		tc.Certificates = []tls.Certificate{c}
	}
	return credentials.NewTLS(tc)
}

// callOnce makes one ShouldRateLimit call on a connection of its own.
func callOnce(addr string, creds credentials.TransportCredentials) error {
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "default/eg/http", Descriptors: []*ratelimitv3.RateLimitDescriptor{routeRule()}})
	return err
}

func loadCAPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no certificate", file)
	}
	return pool, nil
}
