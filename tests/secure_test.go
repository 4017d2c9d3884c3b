package tests

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/extauthz/extauthz/tests/internal/testcerts"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// runToExit runs `extauthz serve` on cfg expecting it to fail at start-up,
// and returns its exit code and output.
func runToExit(t *testing.T, cfg string, env ...string) (int, string) {
	t.Helper()
	path := writeConfig(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "serve", "-config", path)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("extauthz kept running; expected it to refuse to start:\n%s", out)
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	}
	return code, string(out)
}

// A password from the environment works; a wrong one stops start-up with
// a clear message and never prints the password.
func TestRedisPasswordAndACL(t *testing.T) {
	parallel(t)
	srv := testredis.Start(t, "--requirepass", "s3cret-pass")
	admin := srv.Client(func(o *redisOptions) { o.Password = "s3cret-pass" })
	ctx := context.Background()
	// An ACL user limited to the sidecar's keys.
	must(t, admin.Do(ctx, "ACL", "SETUSER", "extauthz", "on", ">user-pass", "~rl:*", "+@all").Err())

	cfg := func(user string) string {
		return fmt.Sprintf("redis: {addrs: [%s], username: %q, password_env: REDIS_PASSWORD}\ndefault_mode: redis\n%s", srv.Addr, user, seedPolicy)
	}
	code, out := runToExit(t, cfg(""), "REDIS_PASSWORD=wrong-pass")
	if code != 1 || !strings.Contains(out, "refused the credentials") || !strings.Contains(out, "$REDIS_PASSWORD") {
		t.Fatalf("wrong password: exit %d\n%s", code, out)
	}
	if strings.Contains(out, "wrong-pass") {
		t.Fatalf("the password appears in the output:\n%s", out)
	}
	code, out = runToExit(t, cfg(""))
	if code != 1 || !strings.Contains(out, "environment variable REDIS_PASSWORD is not set") {
		t.Fatalf("unset password variable: exit %d\n%s", code, out)
	}

	for _, c := range []struct{ user, pass string }{{"", "s3cret-pass"}, {"extauthz", "user-pass"}} {
		must(t, admin.FlushAll(ctx).Err()) // each run starts from a full bucket
		s := startSidecarFile(t, writeConfig(t, cfg(c.user)), []string{"REDIS_PASSWORD=" + c.pass})
		results, elapsed := timedDrive(t, []*sidecar{s}, 150, 8, adaOrder)
		counts := tally(t, results)
		assertAdmitted(t, counts[200], 100, 100, time.Minute, elapsed, 1)
		if s.metric("extauthz_degraded_decisions_total") != 0 || s.metric("extauthz_redis_calls_total", "op", "lease", "result", "ok") == 0 {
			t.Fatalf("user %q: decisions were not made in Redis", c.user)
		}
		if strings.Contains(s.logs.String(), c.pass) {
			t.Fatalf("the password appears in the log")
		}
	}
}

// Redis over TLS, with a client certificate; an untrusted server is
// reported clearly and policies fall back.
func TestRedisTLS(t *testing.T) {
	parallel(t)
	certs := testcerts.Write(t, "redis")
	srv := testredis.StartTLS(t, testredis.TLSFiles{Cert: certs.ServerCert, Key: certs.ServerKey, CA: certs.CA, AuthClients: true})
	cfg := fmt.Sprintf(`redis:
  addrs: [%s]
  tls: {ca_file: %s, cert_file: %s, key_file: %s}
default_mode: hybrid
%s`, srv.Addr, certs.CA, certs.ClientCert, certs.ClientKey, seedPolicy)
	s := startSidecar(t, cfg)
	results, elapsed := timedDrive(t, []*sidecar{s}, 300, 16, adaOrder)
	assertAdmitted(t, tally(t, results)[200], 100, 100, time.Minute, elapsed, 1)
	if s.metric("extauthz_degraded_decisions_total") != 0 {
		t.Fatal("decisions fell back: TLS to Redis did not work")
	}

	// A CA that did not sign the server's certificate.
	other := testcerts.Write(t, "other")
	bad := startSidecar(t, fmt.Sprintf("redis: {addrs: [%s], tls: {ca_file: %s}}\ndefault_mode: hybrid\n%s", srv.Addr, other.CA, seedPolicy))
	if !bad.logShows("certificate", 10*time.Second) {
		t.Fatalf("an untrusted Redis certificate is not reported:\n%s", bad.logs)
	}
	if st := httpStatus(bad.check(adaOrder(0))); st != 200 {
		t.Fatalf("with Redis unusable the policy falls back; got %d", st)
	}
	if bad.metric("extauthz_degraded_decisions_total", "action", "fallback") != 1 {
		t.Fatal("the decision was not counted as a fallback")
	}
}

// The gRPC listener over TLS and mTLS, for sidecars Envoy reaches over a
// network; `extauthz check` speaks it too.
func TestGRPCListenerTLS(t *testing.T) {
	parallel(t)
	certs := testcerts.Write(t, "grpc")
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(certs.CA)
	pool.AppendCertsFromPEM(caPEM)
	clientCert, err := tls.LoadX509KeyPair(certs.ClientCert, certs.ClientKey)
	must(t, err)

	call := func(s *sidecar, creds credentials.TransportCredentials) error {
		conn, err := grpc.NewClient("passthrough:///"+s.GRPC, grpc.WithTransportCredentials(creds))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = authv3.NewAuthorizationClient(conn).Check(ctx, adaOrder(0))
		return err
	}
	tlsOnly := startSidecar(t, fmt.Sprintf("listen: {grpc: 127.0.0.1:0, admin: 127.0.0.1:0, tls: {cert_file: %s, key_file: %s}}\n%s",
		certs.ServerCert, certs.ServerKey, seedPolicy))
	if err := call(tlsOnly, credentials.NewTLS(&tls.Config{RootCAs: pool})); err != nil {
		t.Fatalf("TLS client: %v", err)
	}
	if err := call(tlsOnly, insecure.NewCredentials()); err == nil {
		t.Fatal("a plaintext client was served by a TLS listener")
	}

	mtls := startSidecar(t, fmt.Sprintf("listen: {grpc: 127.0.0.1:0, admin: 127.0.0.1:0, tls: {cert_file: %s, key_file: %s, client_ca_file: %s}}\n%s",
		certs.ServerCert, certs.ServerKey, certs.CA, seedPolicy))
	if err := call(mtls, credentials.NewTLS(&tls.Config{RootCAs: pool})); err == nil {
		t.Fatal("mTLS listener served a client without a certificate")
	}
	if err := call(mtls, credentials.NewTLS(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{clientCert}})); err != nil {
		t.Fatalf("mTLS client: %v", err)
	}
	out, err := exec.Command(binary, "check", "-addr", mtls.GRPC, "-cacert", certs.CA, "-cert", certs.ClientCert, "-key", certs.ClientKey,
		"-H", "x-api-key: key-ada", "POST", "/orders").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ALLOWED") {
		t.Fatalf("extauthz check over mTLS: %v\n%s", err, out)
	}
}
