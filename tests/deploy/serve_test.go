package deploy

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// freePort returns a loopback port nothing listens on right now.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestEnvoyDirConfigServes runs extauthz with envoy/extauthz.yaml (on free
// ports) and sends it the Checks Envoy would, to show the config does what
// its comments promise: an unknown key is a 401, the demo key gets 5 a
// minute, and writes on the orders route (selected by the context
// extension Envoy sets) get 2 a minute and need a key.
func TestEnvoyDirConfigServes(t *testing.T) {
	bin := extauthzBinary(t)
	grpcAddr, adminAddr := freePort(t), freePort(t)
	text := readFile(t, repoPath(t, "envoy/extauthz.yaml"))
	text = edit(t, text, "grpc: 127.0.0.1:9001", "grpc: "+grpcAddr)
	text = edit(t, text, "admin: 127.0.0.1:9090", "admin: "+adminAddr)
	cfg := filepath.Join(t.TempDir(), "extauthz.yaml")
	if err := os.WriteFile(cfg, text, 0o600); err != nil {
		t.Fatal(err)
	}

	var logs bytes.Buffer
	srv := exec.Command(bin, "serve", "-config", cfg)
	srv.Stdout, srv.Stderr = &logs, &logs
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- srv.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			srv.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("extauthz output:\n%s", logs.String())
		}
	})
	waitReady(t, "http://"+adminAddr+"/readyz")

	check := func(want string, args ...string) {
		t.Helper()
		out, _ := exec.Command(bin, append([]string{"check", "-addr", grpcAddr}, args...)...).CombinedOutput()
		if first, _, _ := strings.Cut(string(out), "\n"); !strings.HasPrefix(first, want) {
			t.Errorf("extauthz check %s: got %q, want %s...", strings.Join(args, " "), first, want)
		}
	}
	demo := []string{"-H", "x-api-key: key-demo-123"}
	orders := append([]string{"-context", "route=orders"}, demo...)

	check("DENIED 401", "-H", "x-api-key: not-a-key", "GET", "/")
	check("ALLOWED", append(orders, "POST", "/orders")...)
	check("ALLOWED", append(orders, "POST", "/orders")...)
	check("DENIED 429", append(orders, "POST", "/orders")...) // orders-write: 2 a minute
	check("DENIED 401", "-context", "route=orders", "POST", "/orders")
	for i := 0; i < 3; i++ { // per-client: 5 a minute, 2 spent on writes
		check("ALLOWED", append(demo, "GET", "/")...)
	}
	check("DENIED 429", append(demo, "GET", "/")...)
}

func waitReady(t *testing.T, url string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal(fmt.Errorf("extauthz not ready at %s: %v", url, err))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
