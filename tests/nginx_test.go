package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/extauthz/extauthz/tests/internal/testnginx"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// The HTTP door behind a real nginx running the shipped
// proxies/nginx/extauthz.conf, with only its ports changed: what a user
// who copies that file gets.

const nginxConf = "../proxies/nginx/extauthz.conf"

// The addresses the shipped file names; each test gives them free ports.
const (
	nginxListen  = "127.0.0.1:8080"
	nginxApp     = "127.0.0.1:8081"
	nginxSidecar = "127.0.0.1:9002"
)

// listenHTTP serves the HTTP door beside gRPC and admin, each on a port
// the kernel picks.
const listenHTTP = "listen: {grpc: 127.0.0.1:0, http: 127.0.0.1:0, admin: 127.0.0.1:0}\n"

// startNginx runs the shipped configuration in front of app, asking s.
func startNginx(t *testing.T, s *sidecar, app *upstream) string {
	t.Helper()
	if s.HTTP == "" {
		t.Fatal("the sidecar serves no HTTP door (listen.http)")
	}
	n := testnginx.Start(t, nginxConf, nginxListen, map[string]string{nginxApp: app.addr, nginxSidecar: s.HTTP})
	return "http://" + n.Addr
}

// upstream is the app behind nginx. It answers 200 and records what
// reached it: how many requests, their x-client-id, and any credential
// that should have been stripped.
type upstream struct {
	addr      string
	mu        sync.Mutex
	hits      int
	clientIDs map[string]int // "" counts requests without one
	leaked    []string       // credentials that reached the app
	auth      []string       // Authorization headers that reached it
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{clientIDs: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		defer u.mu.Unlock()
		u.hits++
		u.clientIDs[r.Header.Get("X-Client-Id")]++
		if k := r.Header.Values("X-Api-Key"); len(k) > 0 {
			u.leaked = append(u.leaked, "x-api-key: "+strings.Join(k, ","))
		}
		if a := r.Header.Get("Authorization"); a != "" {
			u.auth = append(u.auth, a)
		}
	}))
	t.Cleanup(srv.Close)
	u.addr = srv.Listener.Addr().String()
	return u
}

func (u *upstream) snapshot() (hits int, ids map[string]int, leaked, auth []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	ids = map[string]int{}
	for k, v := range u.clientIDs {
		ids[k] = v
	}
	return u.hits, ids, append([]string(nil), u.leaked...), append([]string(nil), u.auth...)
}

// reply is one answer nginx sent a client.
type reply struct {
	status int
	header http.Header
	body   string
}

// httpClient talks HTTP/1.1 with keep-alive, as browsers and SDKs do; from
// sets the client's loopback source address (nil: the kernel's choice).
func httpClient(from net.IP) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second}
	if from != nil {
		d.LocalAddr = &net.TCPAddr{IP: from}
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: d.DialContext, MaxIdleConnsPerHost: 128, DisableCompression: true,
	}}
}

// send sends one request: header name/value pairs follow the URL.
func send(t *testing.T, c *http.Client, method, url string, headers ...string) reply {
	t.Helper()
	r, err := sendErr(context.Background(), c, method, url, headers...)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return r
}

func sendErr(ctx context.Context, c *http.Client, method, url string, headers ...string) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return reply{}, err
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b)}, err
}

// driveHTTP sends n requests from `workers` goroutines, request i to
// proxy i % len(proxies) (round robin), and returns every reply in
// request order and how long the run took. The run is bounded by n and by
// a 2-minute deadline.
func driveHTTP(t *testing.T, proxies []string, n, workers int, path string, headers ...string) ([]reply, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := httpClient(nil)
	out := make([]reply, n)
	errs := make([]error, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				out[i], errs[i] = sendErr(ctx, c, "POST", proxies[i%len(proxies)]+path, headers...)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if ctx.Err() != nil {
		t.Fatalf("load run of %d requests did not finish within its deadline", n)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	return out, elapsed
}

// sumMetrics sums a metric over replicas.
func sumMetrics(replicas []*sidecar, name string, labels ...string) float64 {
	var n float64
	for _, r := range replicas {
		n += r.metric(name, labels...)
	}
	return n
}

var rateLimitAllowed = regexp.MustCompile(`^"[a-z_]+";r=\d+;t=\d+$`)

// The seed scenario through nginx: three sidecars at the shipped
// defaults sharing one Redis, each behind an nginx running the shipped
// configuration, 600 POSTs 60 at a time round robin over the three
// nginx: the limit reaches the app, every other request is a 429 from
// nginx carrying Retry-After, the RateLimit headers and extauthz's problem
// body; the app sees x-client-id and never the API key. Once with the
// default token bucket, which may refill a token while the run lasts (one
// per 600ms), and once with a sliding log, which admits exactly 100 in any
// minute, so exactly 100 reach the app.
func TestNginxSeed(t *testing.T) {
	parallel(t)
	testnginx.Binary(t) // fail fast, with how to install it
	const policy = `
clients:
  keys: [{id: ada, key: key-ada}]
policies:
  - {name: orders, match: {path_prefix: /orders, methods: [POST]}, key: [client], limit: 100, window: 1m}
  - {name: ledger, match: {path_prefix: /ledger, methods: [POST]}, key: [client], limit: 100, window: 1m, algorithm: sliding_log}
`
	for _, mode := range []string{"redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			srv := testredis.Start(t)
			replicas := startReplicas(t, 3, listenHTTP+defaultsConfig(srv.Addr, mode, policy))
			app := startUpstream(t)
			var proxies []string
			for _, r := range replicas {
				proxies = append(proxies, startNginx(t, r, app))
			}
			orders := nginxBurst(t, replicas, proxies, app, "orders", 0)
			ledger := nginxBurst(t, replicas, proxies, app, "ledger", orders)
			if ledger != 100 {
				t.Fatalf("sliding log: %d reached the app, want exactly 100", ledger)
			}

			c := httpClient(nil)
			// An unknown key: 401 with WWW-Authenticate and the problem body; no policy runs.
			r := send(t, c, "POST", proxies[0]+"/orders/42", "X-Api-Key", "key-eve")
			var p struct {
				Status int    `json:"status"`
				Detail string `json:"detail"`
			}
			if r.status != 401 || r.header.Get("WWW-Authenticate") != "ApiKey" || r.header.Get("Content-Type") != "application/problem+json" ||
				json.Unmarshal([]byte(r.body), &p) != nil || p.Status != 401 || p.Detail != "Unknown API key." {
				t.Fatalf("unknown key: %d %v %s", r.status, r.header, r.body)
			}
			// The original method reached the door: a GET is not an order.
			if r := send(t, c, "GET", proxies[1]+"/orders/42", "X-Api-Key", "key-ada"); r.status != 200 || r.header.Get("RateLimit") != "" {
				t.Fatalf("GET /orders: %d %v", r.status, r.header)
			}
			// A Bearer key is a key too, and stripped; other schemes pass,
			// and an anonymous caller's x-client-id is removed.
			send(t, c, "GET", proxies[2]+"/public", "Authorization", "Bearer key-ada")
			send(t, c, "GET", proxies[2]+"/public", "Authorization", "Basic YTpi", "X-Client-Id", "forged")
			hits, ids, leaked, auth := app.snapshot()
			if want := orders + ledger + 3; hits != want || ids["ada"] != want-1 || ids[""] != 1 || len(leaked) > 0 || len(auth) != 1 || auth[0] != "Basic YTpi" {
				t.Fatalf("the app saw %d requests, want %d (client ids %v, keys %q, authorization %q)", hits, want, ids, leaked, auth)
			}
			if got := sumMetrics(replicas, "extauthz_checks_total", "door", "http", "outcome", "unauthorized"); got != 1 {
				t.Fatalf(`extauthz_checks_total{door="http",outcome="unauthorized"} = %v, want 1`, got)
			}
			assertNotDegraded(t, replicas)
		})
	}
}

// nginxBurst sends the seed burst as ada to policy's path through the
// proxies and checks every answer, what reached the app (which had seen
// `before` requests) and the replicas' counts. It returns how many were
// admitted.
func nginxBurst(t *testing.T, replicas []*sidecar, proxies []string, app *upstream, policy string, before int) int {
	t.Helper()
	overBefore := sumMetrics(replicas, "extauthz_checks_total", "door", "http", "outcome", "over_limit")
	okBefore := sumMetrics(replicas, "extauthz_checks_total", "door", "http", "outcome", "ok")
	// A client-sent x-client-id must not reach the app either.
	replies, elapsed := driveHTTP(t, proxies, seedBurst, seedConcurrency, "/"+policy+"/42?page=1",
		"X-Api-Key", "key-ada", "X-Client-Id", "forged")
	counts := map[int]int{}
	for _, r := range replies {
		counts[r.status]++
	}
	if counts[200]+counts[429] != seedBurst {
		hits, _, _, _ := app.snapshot()
		t.Fatalf("%s: statuses = %v in %v; app hits %d; allowed decisions %v", policy, counts, elapsed, hits, allowedDecisions(replicas, policy))
	}
	buckets := 0
	if policy == "orders" {
		buckets = 1 // the token bucket refills while the run lasts
	}
	t.Logf("%s through nginx: %d of %d reached the app, %d got 429", policy, counts[200], seedBurst, counts[429])
	// Exactness holds for decisions Redis made: say so first when some
	// were not, since every check below then fails for that reason.
	assertNotDegraded(t, replicas)
	assertAdmitted(t, counts[200], 100, 100, time.Minute, elapsed, buckets)
	quota := fmt.Sprintf(`"%s";q=100;w=60`, policy)
	for i, r := range replies {
		if r.status == 200 {
			if r.header.Get("RateLimit-Policy") != quota || !rateLimitAllowed.MatchString(r.header.Get("RateLimit")) {
				t.Fatalf("%s: allowed request %d: headers %v", policy, i, r.header)
			}
			continue
		}
		assertNginx429(t, policy, i, r)
	}
	hits, ids, leaked, auth := app.snapshot()
	if hits-before != counts[200] || ids["ada"] != hits || len(leaked)+len(auth) > 0 {
		t.Fatalf("%s: the app saw %d requests (client ids %v, credentials %q %q); %d were allowed", policy, hits-before, ids, leaked, auth, counts[200])
	}
	if got := sumMetrics(replicas, "extauthz_checks_total", "door", "http", "outcome", "over_limit") - overBefore; got != float64(counts[429]) {
		t.Fatalf(`%s: extauthz_checks_total{door="http",outcome="over_limit"} rose by %v over the replicas; nginx sent %d 429s`, policy, got, counts[429])
	}
	if got := sumMetrics(replicas, "extauthz_checks_total", "door", "http", "outcome", "ok") - okBefore; got != float64(counts[200]) {
		t.Fatalf(`%s: extauthz_checks_total{door="http",outcome="ok"} rose by %v; nginx allowed %d`, policy, got, counts[200])
	}
	if got := allowedDecisions(replicas, policy); got != float64(counts[200]) {
		t.Fatalf("%s: replicas count %v allowed decisions, nginx %d", policy, got, counts[200])
	}
	return counts[200]
}

// assertNginx429 checks a denial as nginx sends it: Retry-After in whole
// seconds, the RateLimit headers agreeing with it, and extauthz's problem
// body.
func assertNginx429(t *testing.T, policy string, i int, r reply) {
	t.Helper()
	retry, err := strconv.Atoi(r.header.Get("Retry-After"))
	if r.status != 429 || err != nil || retry < 1 || retry > 60 {
		t.Fatalf("%s: request %d: %d, Retry-After %q", policy, i, r.status, r.header.Get("Retry-After"))
	}
	if r.header.Get("RateLimit-Policy") != fmt.Sprintf(`"%s";q=100;w=60`, policy) || r.header.Get("RateLimit") != fmt.Sprintf(`"%s";r=0;t=%d`, policy, retry) ||
		r.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("%s: request %d: 429 headers %v", policy, i, r.header)
	}
	var p struct {
		Type     string   `json:"type"`
		Status   int      `json:"status"`
		Detail   string   `json:"detail"`
		Violated []string `json:"violated-policies"`
	}
	if err := json.Unmarshal([]byte(r.body), &p); err != nil || p.Type != "https://iana.org/assignments/http-problem-types#quota-exceeded" ||
		p.Status != 429 || p.Detail != fmt.Sprintf("Retry after %d s.", retry) || len(p.Violated) != 1 || p.Violated[0] != policy {
		t.Fatalf("%s: request %d: 429 body %q", policy, i, r.body)
	}
}

// Behind nginx the door's peer is nginx, so the ip key comes from the
// X-Forwarded-For entry nginx appends, through ip_trusted_hops: entries a
// client sends are never its identity. Clients on two loopback addresses
// get a bucket each whatever X-Forwarded-For they forge. And when the
// sidecar is gone, nginx fails closed with a 503.
func TestNginxClientIPAndFailClosed(t *testing.T) {
	parallel(t)
	// Not the default: ip_trusted_hops: 1 says one proxy (nginx) stands
	// between clients and the door; at 0 every client is nginx's address.
	s := startSidecar(t, listenHTTP+`
ip_trusted_hops: 1
policies:
  - {name: per-ip, key: [ip], limit: 2, window: 1m}
`)
	app := startUpstream(t)
	proxy := startNginx(t, s, app)
	for _, from := range []string{"127.0.0.2", "127.0.0.3"} {
		c := httpClient(net.ParseIP(from))
		for i, want := range []int{200, 200, 429} {
			r := send(t, c, "GET", proxy+"/", "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i))
			if r.status != want {
				t.Fatalf("client %s, request %d (forged X-Forwarded-For): %d, want %d", from, i, r.status, want)
			}
		}
	}
	if hits, _, _, _ := app.snapshot(); hits != 4 {
		t.Fatalf("the app saw %d requests, want 4", hits)
	}

	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	r := send(t, httpClient(nil), "GET", proxy+"/")
	var p struct{ Status int }
	if r.status != 503 || json.Unmarshal([]byte(r.body), &p) != nil || p.Status != 503 {
		t.Fatalf("sidecar gone: %d %s", r.status, r.body)
	}
}

// on_redis_error: deny while Redis is down: nginx passes extauthz's 503
// with Retry-After and its problem body.
func TestNginxRedisUnavailable(t *testing.T) {
	parallel(t)
	srv := testredis.Start(t)
	s := startSidecar(t, listenHTTP+defaultsConfig(srv.Addr, "redis", `
policies:
  - {name: strict, limit: 100, window: 1m, on_redis_error: deny}
`))
	app := startUpstream(t)
	proxy := startNginx(t, s, app)
	c := httpClient(nil)
	if r := send(t, c, "GET", proxy+"/"); r.status != 200 {
		t.Fatalf("with Redis up: %d", r.status)
	}
	srv.Kill()
	r := send(t, c, "GET", proxy+"/")
	var p struct {
		Type     string   `json:"type"`
		Violated []string `json:"violated-policies"`
	}
	if r.status != 503 || r.header.Get("Retry-After") == "" || json.Unmarshal([]byte(r.body), &p) != nil ||
		p.Type != "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity" || len(p.Violated) != 1 {
		t.Fatalf("with Redis down: %d %v %s", r.status, r.header, r.body)
	}
}
