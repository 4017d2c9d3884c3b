package caddy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard" // what the caddy command links in
)

// extauthz is the binary under test, built once from the repository.
var extauthz string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "extauthz-caddy-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	extauthz = filepath.Join(dir, "extauthz")
	build := exec.Command("go", "build", "-o", extauthz, "./cmd/extauthz")
	build.Dir = filepath.Join("..", "..")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building extauthz:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// repoFile reads a file the repository ships.
func repoFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// withPorts replaces each address in text; every one must occur in
// exactly one line that is not a comment, so a change to the shipped file
// cannot slip past the substitution.
func withPorts(t *testing.T, name, text string, addrs map[string]string) string {
	t.Helper()
	for old, repl := range addrs {
		n := 0
		for _, line := range strings.Split(text, "\n") {
			code, _, _ := strings.Cut(line, "#")
			n += strings.Count(code, old)
		}
		if n != 1 {
			t.Fatalf("%s names %s in %d settings, want one", name, old, n)
		}
		text = strings.ReplaceAll(text, old, repl)
	}
	return text
}

// sidecar is one extauthz process.
type sidecar struct {
	HTTP, Admin string
	logs        *lockedBuffer
}

// startSidecar runs `extauthz serve` on cfg and reads the addresses it
// got from its "serving" log line.
func startSidecar(t *testing.T, cfg string) *sidecar {
	t.Helper()
	path := filepath.Join(t.TempDir(), "extauthz.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &sidecar{logs: &lockedBuffer{}}
	cmd := exec.Command(extauthz, "serve", "-config", path, "-log-format", "json")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan map[string]any, 1)
	done := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			s.logs.Write(append(sc.Bytes(), '\n'))
			var rec map[string]any
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == "serving" {
				ready <- rec
			}
		}
		cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("extauthz log:\n%s", s.logs)
		}
	})
	select {
	case rec := <-ready:
		s.HTTP, _ = rec["http"].(string)
		s.Admin, _ = rec["admin"].(string)
	case <-done:
		t.Fatalf("extauthz exited before serving:\n%s", s.logs)
	case <-time.After(30 * time.Second):
		t.Fatalf("extauthz did not serve within 30s:\n%s", s.logs)
	}
	return s
}

// metric reads one extauthz_checks_total sample of the HTTP door.
func (s *sidecar) checks(t *testing.T, outcome string) string {
	t.Helper()
	resp, err := http.Get("http://" + s.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	prefix := `extauthz_checks_total{door="http",outcome="` + outcome + `"} `
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			return v
		}
	}
	return ""
}

// app is the upstream: it records what reached it.
type app struct {
	mu   sync.Mutex
	seen []http.Header
}

func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seen = append(a.seen, r.Header.Clone())
}

func (a *app) requests() []http.Header {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]http.Header(nil), a.seen...)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// globals keep the in-process Caddy to itself: no admin endpoint, no
// files outside the test's directory, errors only in the log.
const globals = `{
	admin off
	persist_config off
	storage file_system %s
	log {
		level ERROR
	}
}

`

// startCaddy adapts the Caddyfile with Caddy's own adapter, failing on
// any warning, and runs it in this process until the test ends.
func startCaddy(t *testing.T, file string) {
	t.Helper()
	cfg, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(fmt.Sprintf(globals, t.TempDir())+file), nil)
	if err != nil {
		t.Fatalf("Caddyfile: %v", err)
	}
	for _, w := range warnings {
		t.Errorf("Caddyfile: %s", w)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("caddy: %v", err)
	}
	t.Cleanup(func() { caddy.Stop() })
}

type reply struct {
	status int
	header http.Header
	body   string
}

func send(t *testing.T, method, url string, headers ...string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

// The shipped Caddyfile in a real Caddy in front of the shipped
// proxies/extauthz.yaml: allowed requests reach the app with the verified
// x-client-id and without the API key; a 429 reaches the client with
// Retry-After, the RateLimit headers and the problem body; an unknown key
// is a 401 with WWW-Authenticate; the original method and URI, as Caddy
// passes them, select the policies.
func TestCaddyForwardAuth(t *testing.T) {
	raw := repoFile(t, "proxies/caddy/Caddyfile")
	if formatted := string(caddyfile.Format([]byte(raw))); formatted != raw {
		t.Errorf("proxies/caddy/Caddyfile is not formatted as `caddy fmt` formats it:\n%s", formatted)
	}
	s := startSidecar(t, withPorts(t, "proxies/extauthz.yaml", repoFile(t, "proxies/extauthz.yaml"), map[string]string{
		"127.0.0.1:9001": "127.0.0.1:0", "127.0.0.1:9002": "127.0.0.1:0", "127.0.0.1:9090": "127.0.0.1:0",
	}))
	up := &app{}
	upstream := httptest.NewServer(up)
	t.Cleanup(upstream.Close)
	site := freeAddr(t)
	startCaddy(t, withPorts(t, "proxies/caddy/Caddyfile", raw, map[string]string{
		"127.0.0.1:8080": site, "127.0.0.1:8081": upstream.Listener.Addr().String(), "127.0.0.1:9002": s.HTTP,
	}))
	url := "http://" + site

	// orders-write allows 2 writes a minute per key.
	for i, want := range []int{200, 200, 429} {
		r := send(t, "POST", url+"/orders/1?x=1", "X-Api-Key", "key-demo-123", "X-Client-Id", "forged")
		if r.status != want {
			t.Fatalf("order %d: %d %s, want %d", i, r.status, r.body, want)
		}
		if want == 429 {
			var p struct {
				Type     string   `json:"type"`
				Detail   string   `json:"detail"`
				Violated []string `json:"violated-policies"`
			}
			retry := r.header.Get("Retry-After")
			if retry == "" || r.header.Get("RateLimit-Policy") != `"orders-write";q=2;w=60` ||
				r.header.Get("RateLimit") != `"orders-write";r=0;t=`+retry || r.header.Get("Content-Type") != "application/problem+json" ||
				json.Unmarshal([]byte(r.body), &p) != nil || p.Type != "https://iana.org/assignments/http-problem-types#quota-exceeded" ||
				p.Detail != "Retry after "+retry+" s." || len(p.Violated) != 1 || p.Violated[0] != "orders-write" {
				t.Fatalf("429 through Caddy: %v %s", r.header, r.body)
			}
		}
	}
	// Caddy passes the URI as the client wrote it; the door normalises it.
	if r := send(t, "POST", url+"//%6Frders/./2", "X-Api-Key", "key-demo-123"); r.status != 429 {
		t.Fatalf("POST //%%6Frders/./2 escaped orders-write: %d", r.status)
	}
	// The method is the original one: a read is not a write.
	if r := send(t, "GET", url+"/orders/1", "X-Api-Key", "key-demo-123"); r.status != 200 {
		t.Fatalf("GET /orders/1: %d %s", r.status, r.body)
	}
	// An unknown key; a write without a key (on_missing_key: reject).
	r := send(t, "GET", url+"/", "X-Api-Key", "key-eve")
	if r.status != 401 || r.header.Get("WWW-Authenticate") != "ApiKey" || !strings.Contains(r.body, `"detail":"Unknown API key."`) {
		t.Fatalf("unknown key through Caddy: %d %v %s", r.status, r.header, r.body)
	}
	if r := send(t, "POST", url+"/orders"); r.status != 401 {
		t.Fatalf("anonymous write: %d %s", r.status, r.body)
	}
	// A Bearer key is a key too, and stripped; other schemes pass; an
	// anonymous caller's x-client-id is removed.
	send(t, "GET", url+"/profile", "Authorization", "Bearer key-ada-456", "X-Client-Id", "forged")
	send(t, "GET", url+"/public", "Authorization", "Basic YTpi", "X-Client-Id", "forged")

	seen := up.requests()
	want := []struct{ client, auth string }{{"demo", ""}, {"demo", ""}, {"demo", ""}, {"ada", ""}, {"", "Basic YTpi"}}
	if len(seen) != len(want) {
		t.Fatalf("the app saw %d requests, want %d", len(seen), len(want))
	}
	for i, h := range seen {
		if h.Get("X-Client-Id") != want[i].client || len(h.Values("X-Client-Id")) > 1 || h.Get("Authorization") != want[i].auth || h.Get("X-Api-Key") != "" {
			t.Errorf("request %d reached the app with %v; want client %q, authorization %q, no API key", i, h, want[i].client, want[i].auth)
		}
	}
	for outcome, n := range map[string]string{"ok": "5", "over_limit": "2", "unauthorized": "2", "error": "0"} {
		if got := s.checks(t, outcome); got != n {
			t.Errorf(`extauthz_checks_total{door="http",outcome=%q} = %q, want %s`, outcome, got, n)
		}
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
