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
	"time"

	"github.com/extauthz/extauthz/internal/engine"
)

// Door is this door's name in the metrics: extauthz_checks_total{door="http"}.
const Door = "http"

// Server is the HTTP door, an http.Handler. Safe for concurrent use.
type Server struct {
	running *engine.Running
	door    *engine.Door
	now     func() time.Time
	log     *slog.Logger // decisions that failed; nil: none logged
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
	s := &Server{running: running, door: running.Metrics().Door(Door)}
	for _, o := range opts {
		o(s)
	}
	return s
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
	eng := s.running.Engine()
	cfg := eng.Config()
	var req engine.Request
	conv, bad := newRequest(r, &cfg.HTTP, &req)
	if bad != nil {
		misconfigured(w, conv, bad)
		s.door.Observe(engine.Failed, time.Since(start).Seconds())
		return
	}
	var v engine.Verdict
	err := eng.Decide(r.Context(), &req, now, &v)
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
		deny(w, conv, &v, cfg)
	case v.Outcome == engine.OK:
		allow(w, conv, &v, cfg)
	default:
		deny(w, conv, &v, cfg)
	}
	s.door.Observe(v.Outcome, time.Since(start).Seconds())
}
