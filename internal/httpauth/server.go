// Package httpauth is the HTTP door: the authorization endpoint of proxies
// that ask an HTTP server rather than a gRPC one. Envoy's ext_authz
// http_service, nginx's auth_request and the forward-auth middleware of
// Traefik and Caddy all send a request describing the original one and
// read the answer: 2xx allows, with headers to copy; anything else denies,
// and (depending on the proxy) the answer's status, headers and body reach
// the client.
//
// The decision is the engine's, the same one the gRPC door makes: one
// engine.Running is shared by both doors, so a reload compiles once and
// both decide with the same policies, counters and limiters. This package
// only reads each proxy's way of telling the original request
// (request.go) and writes the answer (respond.go).
package httpauth

import (
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/extauthz/extauthz/internal/engine"
)

// Door is this door's name in the metrics: extauthz_checks_total{door="http"}.
const Door = "http"

// Server is the HTTP door, an http.Handler. Safe for concurrent use.
type Server struct {
	door *engine.DoorMetrics
	now  func() time.Time
	log  *slog.Logger // decisions that failed; nil: none logged
	// compiled is what this door derives from each configuration.
	compiled *engine.PerEngine[compiled]
}

// compiled is one configuration as this door uses it: the configured
// header names in Go's canonical form (looked up with no allocation), and
// the header values shared, read-only, by every answer about a limit or a
// client, indexed by the engine's numbering.
type compiled struct {
	uriKey, methodKey   string     // http.uri_header, http.method_header, canonical
	uriName, methodName string     // the same, as configured (lower case)
	policyVals          [][]string // RateLimit-Policy, by Limit.Index
	clientVals          [][]string // X-Client-Id, by Client.Index
	// read are the request headers decisions read
	// (engine.RequestHeaders), with their canonical keys.
	read []struct{ name, key string }
}

func compile(eng *engine.Engine) *compiled {
	h := eng.Config().HTTP
	c := &compiled{
		uriKey: http.CanonicalHeaderKey(h.URIHeader), methodKey: http.CanonicalHeaderKey(h.MethodHeader),
		uriName: h.URIHeader, methodName: h.MethodHeader,
		policyVals: make([][]string, eng.LimitCount()),
	}
	for _, p := range eng.Policies() {
		for _, l := range p.Limits() {
			c.policyVals[l.Index] = []string{l.Header}
		}
	}
	for _, cl := range eng.Clients() {
		c.clientVals = append(c.clientVals, []string{cl.ID})
	}
	for _, n := range eng.RequestHeaders() {
		c.read = append(c.read, struct{ name, key string }{n, http.CanonicalHeaderKey(n)})
	}
	return c
}

// headers fills m, empty, with the engine's view of h: the headers
// decisions read, by lower-case name, repeated ones joined with commas as
// Envoy joins them. Only those: copying every header a client sent into
// another map would be most of this door's cost.
func (c *compiled) headers(h http.Header, m map[string]string) map[string]string {
	for _, r := range c.read {
		switch vs := h[r.key]; len(vs) {
		case 0:
		case 1:
			m[r.name] = vs[0]
		default:
			m[r.name] = strings.Join(vs, ",")
		}
	}
	return m
}

// Option configures a Server.
type Option func(*Server)

// WithClock sets the source of decision instants (by default the instant
// the request arrived). Each request reads it once.
func WithClock(now func() time.Time) Option { return func(s *Server) { s.now = now } }

// WithLog logs decisions that failed for a reason no policy setting
// covers (the answer is a 500 whose body does not say why).
func WithLog(log *slog.Logger) Option { return func(s *Server) { s.log = log } }

// New returns the HTTP door deciding with running, the configuration the
// process's doors share.
func New(running *engine.Running, opts ...Option) *Server {
	s := &Server{door: running.Metrics().Door(Door), compiled: engine.NewPerEngine(running, compile)}
	for _, o := range opts {
		o(s)
	}
	return s
}

// scratch is one request's working memory, recycled because each part
// would otherwise be allocated per request: Decide's pointers move a
// local Request and Verdict (a kilobyte and a half, room for eight
// policies' decisions) to the heap, and a map of even one entry allocates
// a group of eight. Nothing in it outlives ServeHTTP: what the answer
// carries is strings.
type scratch struct {
	req     engine.Request
	v       engine.Verdict
	headers map[string]string
}

var scratches = sync.Pool{New: func() any { return &scratch{headers: make(map[string]string, 8)} }}

func (sc *scratch) release() {
	sc.req = engine.Request{}
	clear(sc.headers)
	scratches.Put(sc)
}

// ServeHTTP answers one auth request. It never reads the body: proxies
// send none (Envoy without with_request_body, nginx with
// proxy_pass_request_body off, forward-auth always).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	now := start
	if s.now != nil {
		now = s.now()
	}
	if r.ContentLength != 0 {
		// The door never reads a body, and net/http reads what is left
		// of one (up to 256 KiB) before writing the answer and again
		// before reusing the connection: a body announced and never sent
		// held the connection, unanswered, as long as its client liked.
		// So the read deadline after the headers is now, and the
		// connection is closed after the answer. The proxies send no
		// body (nginx's auth_request, Envoy without with_request_body).
		http.NewResponseController(w).SetReadDeadline(time.Now())
		w.Header()["Connection"] = []string{"close"}
	}
	eng, c := s.compiled.Get()
	cfg := eng.Config()
	sc := scratches.Get().(*scratch)
	defer sc.release()
	conv, bad := newRequest(r, c, sc.headers, &sc.req)
	if bad != nil {
		misconfigured(w, conv, bad)
		s.door.Observe(engine.Failed, time.Since(start).Seconds())
		return
	}
	v := &sc.v
	err := eng.Decide(r.Context(), &sc.req, now, v)
	switch {
	case err != nil && v.Outcome == engine.Canceled:
		// The proxy went away while a leaky bucket held the request: no
		// one reads this answer, but it must not be a 200.
		body := engine.Problem{Type: "about:blank", Title: "Service Unavailable", Status: http.StatusServiceUnavailable,
			Detail: "The request was abandoned while it waited for its slot."}.JSON()
		writeProblem(w, conv, http.StatusServiceUnavailable, body)
	case err != nil:
		// A limiter's internal failure (Redis trouble is on_redis_error's,
		// never an error here). The body may reach the client: the
		// cause goes to the log only.
		if s.log != nil {
			s.log.LogAttrs(r.Context(), slog.LevelError, "decision failed", slog.String("door", Door), slog.String("error", err.Error()))
		}
		v.Outcome, v.Detail = engine.Failed, "The rate limit decision failed."
		deny(w, conv, v, cfg)
	case v.Outcome == engine.OK:
		allow(w, conv, v, c, cfg)
	default:
		deny(w, conv, v, cfg)
	}
	s.door.Observe(v.Outcome, time.Since(start).Seconds())
}
