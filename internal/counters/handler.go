package counters

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/extauthz/extauthz/internal/engine"
)

// callTimeout bounds each request's work: a read or reset is a few Redis
// round trips at most (top: one per key listed).
const callTimeout = 5 * time.Second

// Handler serves the counters API. Set its fields, then Register it.
type Handler struct {
	// Engine returns the running configuration's engine.
	Engine func() *engine.Engine
	// Forget drops what this process holds of a partition key in every
	// limiter (local counts, levels, hybrid slices, fallback buckets).
	Forget func(partition string)
	// Publish tells the other replicas a partition key was reset; nil
	// without Redis (a reset is then this replica's alone).
	Publish func(ctx context.Context, partition string) error
	// Token is the SHA-256 of the bearer token; the zero value turns the
	// API off (every request gets 403).
	Token [32]byte
	// Now is the clock (time.Now when nil).
	Now     func() time.Time
	Log     *slog.Logger
	Metrics *Metrics
}

// Metrics are the counters API's collectors.
type Metrics struct {
	// Resets counts counter resets applied on this replica, by origin:
	// api (asked here) or replica (announced by another replica).
	Resets *prometheus.CounterVec
}

// NewMetrics creates the collectors and registers them with reg (none
// when reg is nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{Resets: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "extauthz", Name: "counter_resets_total",
		Help: "Counter resets applied on this replica, by origin (api: asked here; replica: announced by another replica).",
	}, []string{"origin"})}
	m.Resets.WithLabelValues("api")
	m.Resets.WithLabelValues("replica")
	if reg != nil {
		reg.MustRegister(m.Resets)
	}
	return m
}

// TokenDigest returns the digest Handler.Token holds for token; the zero
// digest for "" (the API off).
func TokenDigest(token string) [32]byte {
	if token == "" {
		return [32]byte{}
	}
	return sha256.Sum256([]byte(token))
}

// Register adds the API's routes to mux.
func (h *Handler) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/counters/{policy}", h.authorized(h.get))
	mux.HandleFunc("DELETE /v1/counters/{policy}", h.authorized(h.reset))
	mux.HandleFunc("GET /v1/counters/{policy}/top", h.authorized(h.top))
}

// ForgetAnnounced applies a reset another replica announced.
func (h *Handler) ForgetAnnounced(partition string) {
	h.Forget(partition)
	h.Metrics.Resets.WithLabelValues("replica").Inc()
}

func (h *Handler) now() time.Time {
	if h.Now != nil {
		return h.Now()
	}
	return time.Now()
}

// authorized checks the bearer token, by digest in constant time, before
// next runs. The token is never logged.
func (h *Handler) authorized(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if h.Token == ([32]byte{}) {
			problem(w, http.StatusForbidden, "The counters API is off: start the sidecar with a bearer token in $"+TokenEnv+".")
			return
		}
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		got := sha256.Sum256([]byte(strings.TrimSpace(token)))
		if !ok || subtle.ConstantTimeCompare(got[:], h.Token[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="extauthz admin"`)
			problem(w, http.StatusUnauthorized, "A valid bearer token is required (Authorization: Bearer, the sidecar's $"+TokenEnv+").")
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), callTimeout)
		defer cancel()
		next(w, r.WithContext(ctx))
	}
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	c, err := h.Engine().Counter(r.Context(), r.PathValue("policy"), q.Get("key"), q.Get("plan"), h.now())
	if err != nil {
		fail(w, err)
		return
	}
	reply(w, fromEngine(c))
}

func (h *Handler) reset(w http.ResponseWriter, r *http.Request) {
	policy, key := r.PathValue("policy"), r.URL.Query().Get("key")
	partition, err := h.Engine().ResetCounter(r.Context(), policy, key)
	if err != nil {
		fail(w, err)
		return
	}
	h.Forget(partition)
	h.Metrics.Resets.WithLabelValues("api").Inc()
	if h.Log != nil {
		// The partition key is not logged: it may hold an address or a
		// claim (see docs/operations.md, Logs).
		h.Log.Info("counter reset through the admin API", "policy", policy, "remote", r.RemoteAddr)
	}
	out := Reset{Policy: policy, Key: key}
	if h.Publish != nil {
		if err := h.Publish(r.Context(), partition); err != nil {
			problem(w, http.StatusBadGateway, "The count was reset in Redis and on this replica, but the other replicas could not be told ("+err.Error()+"); they drop what they hold of it when their hybrid slices idle out.")
			return
		}
		out.Broadcast = true
	}
	reply(w, out)
}

func (h *Handler) top(w http.ResponseWriter, r *http.Request) {
	n := 10
	if s := r.URL.Query().Get("n"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > engine.MaxTop {
			problem(w, http.StatusBadRequest, "n must be an integer between 1 and "+strconv.Itoa(engine.MaxTop)+".")
			return
		}
		n = v
	}
	policy := r.PathValue("policy")
	cs, err := h.Engine().TopCounters(r.Context(), policy, n, h.now())
	if err != nil {
		fail(w, err)
		return
	}
	out := Top{Policy: policy, Keys: []Counter{}}
	for _, c := range cs {
		jc := fromEngine(c)
		if c.Err != nil {
			jc.Error, jc.Where, jc.Allowed = c.Err.Error(), "", false
		}
		out.Keys = append(out.Keys, jc)
	}
	reply(w, out)
}

// fail answers an engine error: the caller's mistake (400, 404) or a
// store that could not answer (503).
func fail(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, engine.ErrNoPolicy), errors.Is(err, engine.ErrNoPlan):
		problem(w, http.StatusNotFound, err.Error()+".")
	case errors.Is(err, engine.ErrBadKey):
		problem(w, http.StatusBadRequest, err.Error()+".")
	default:
		problem(w, http.StatusServiceUnavailable, "The count could not be read or reset: "+err.Error()+".")
	}
}

func reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func problem(w http.ResponseWriter, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(Problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail})
}
