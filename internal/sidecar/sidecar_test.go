package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/rlsconfig"
)

// A reload commits no door until every door compiled its next
// configuration: a door that fails to prepare, wherever it is in the
// list, leaves every other door's running configuration in force.
func TestSwapCommitsEveryDoorOrNone(t *testing.T) {
	refused := errors.New("does not compile")
	for failing := range 3 {
		var committed []int
		doors := make([]func() (func(), error), 3)
		for i := range doors {
			doors[i] = func() (func(), error) {
				if i == failing {
					return nil, refused
				}
				return func() { committed = append(committed, i) }, nil
			}
		}
		if err := swap(doors...); !errors.Is(err, refused) || len(committed) > 0 {
			t.Errorf("door %d refuses: swap returned %v and committed doors %v, want %v and none", failing, err, committed, refused)
		}
	}
	var committed []int
	if err := swap(
		func() (func(), error) { return func() { committed = append(committed, 0) }, nil },
		func() (func(), error) { return func() { committed = append(committed, 1) }, nil },
	); err != nil || len(committed) != 2 {
		t.Fatalf("every door compiles: swap returned %v and committed doors %v, want nil and both", err, committed)
	}
}

// testConfig is a configuration listening on free loopback ports (the
// HTTP door too), written to a file so reloads read it, with a domain file
// for the rate limit service in a directory of its own.
func testConfig(t *testing.T) (path, domains string) {
	t.Helper()
	dir := t.TempDir()
	domains = filepath.Join(dir, "domains")
	if err := os.Mkdir(domains, 0o700); err != nil {
		t.Fatal(err)
	}
	writeDomain(t, domains, 3)
	path = filepath.Join(dir, "extauthz.yaml")
	writeFile(t, path, fmt.Sprintf(`listen: {grpc: 127.0.0.1:0, http: 127.0.0.1:0, admin: 127.0.0.1:0}
plans:
  default: {limit: 10, window: 1m}
policies:
  - {name: everyone, key: [client], limit: plan}
rls: {domains: [%s]}
`, domains))
	return path, domains
}

func writeDomain(t *testing.T, dir string, limit int) {
	t.Helper()
	writeFile(t, filepath.Join(dir, "edge.yaml"), fmt.Sprintf("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", limit))
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// newTestSidecar builds the process for the configuration at path as
// serve does, logging into the test's log.
func newTestSidecar(t *testing.T, path string, o Options) *Sidecar {
	t.Helper()
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := rlsconfig.LoadFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	o.Load, o.Version = config.Load, "test"
	s, err := New(cfg, rc, o, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A reload changes the configuration of every door or of none: a main
// file and a domain file that both change are taken together; a domain
// file that does not load keeps Check's and the HTTP door's configuration
// as well as the rate limit service's.
func TestReloadChangesEveryDoorOrNone(t *testing.T) {
	path, domains := testConfig(t)
	s := newTestSidecar(t, path, Options{})
	engine, descriptors := s.running.Engine(), s.rls.Config()

	main, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, strings.Replace(string(main), "default: {limit: 10, window: 1m}", "default: {limit: 20, window: 1m}", 1))
	writeFile(t, filepath.Join(domains, "edge.yaml"), "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	if err := s.Reload("test"); err == nil {
		t.Fatal("a domain file with an unknown unit reloaded")
	}
	if s.running.Engine() != engine || s.rls.Config() != descriptors {
		t.Fatal("a reload refused for its domain file changed a door's configuration")
	}

	writeDomain(t, domains, 6)
	if err := s.Reload("test"); err != nil {
		t.Fatal(err)
	}
	if s.running.Engine() == engine || s.rls.Config() == descriptors {
		t.Fatalf("a reload of valid files: Check's engine changed %v, the descriptors changed %v; want both",
			s.running.Engine() != engine, s.rls.Config() != descriptors)
	}
	if got := s.running.Config().Plans["default"].Limit; got != 20 {
		t.Fatalf("after the reload the default plan's limit is %d, want 20", got)
	}
}

// Shutdown goes in order: NOT_SERVING with every door still answering for
// the drain delay; then the doors stop; only then does what talks to
// Redis close, while the admin listener still answers; the admin listener
// closes last.
func TestShutdownOrder(t *testing.T) {
	path, _ := testConfig(t)
	s := newTestSidecar(t, path, Options{DrainDelay: 300 * time.Millisecond, Grace: 5 * time.Second})
	type seen struct{ grpcAnswers, httpAnswers, adminAnswers bool }
	storesClosed := make(chan seen, 1)
	s.closeStores = func() {
		storesClosed <- seen{answers(s.addrs.grpc), answers(s.addrs.http), adminSays(s.addrs.admin, "/healthz") == http.StatusOK}
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(s.addrs.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	if st := servingStatus(health); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("before shutdown the gRPC health is %v", st)
	}
	if code := adminSays(s.addrs.admin, "/readyz"); code != http.StatusOK {
		t.Fatalf("before shutdown /readyz answers %d", code)
	}

	exit := make(chan int, 1)
	go func() { exit <- s.Shutdown(nil) }()
	time.Sleep(100 * time.Millisecond) // within the drain delay
	if st := servingStatus(health); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("during the drain delay the gRPC health is %v, want NOT_SERVING", st)
	}
	if code := adminSays(s.addrs.admin, "/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("during the drain delay /readyz answers %d, want 503", code)
	}
	if code := doorSays(s.addrs.http); code == 0 {
		t.Error("during the drain delay the HTTP door does not answer")
	}

	select {
	case got := <-storesClosed:
		if got.grpcAnswers || got.httpAnswers || !got.adminAnswers {
			t.Errorf("when the stores closed: gRPC door open %v, HTTP door open %v, admin open %v; want the doors closed and admin open",
				got.grpcAnswers, got.httpAnswers, got.adminAnswers)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stores were not closed")
	}
	if code := <-exit; code != 0 {
		t.Fatalf("Shutdown returned %d, want 0", code)
	}
	if answers(s.addrs.admin) {
		t.Fatal("the admin listener still accepts connections after Shutdown")
	}
}

// A second signal during the drain delay stops at once, with exit code 1.
func TestShutdownStopsAtOnceWhenAsked(t *testing.T) {
	path, _ := testConfig(t)
	s := newTestSidecar(t, path, Options{DrainDelay: time.Minute, Grace: time.Minute})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	hurry := make(chan struct{})
	exit := make(chan int, 1)
	go func() { exit <- s.Shutdown(hurry) }()
	close(hurry)
	select {
	case code := <-exit:
		if code != 1 {
			t.Fatalf("stopped at once: exit code %d, want 1", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown waited out the drain delay although told to stop now")
	}
	if answers(s.addrs.grpc) {
		t.Fatal("the gRPC door still accepts connections")
	}
}

// answers tells whether addr accepts a connection.
func answers(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func adminSays(addr, path string) int {
	return get("http://" + addr + path)
}

// doorSays asks the HTTP door something; any status is an answer.
func doorSays(addr string) int {
	return get("http://" + addr + "/nginx")
}

func get(url string) int {
	c := http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(url)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func servingStatus(h healthpb.HealthClient) healthpb.HealthCheckResponse_ServingStatus {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := h.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return healthpb.HealthCheckResponse_UNKNOWN
	}
	return resp.Status
}
