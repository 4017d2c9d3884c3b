package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/extauthz/extauthz/internal/anchorstats"
	"github.com/extauthz/extauthz/internal/check"
	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/connlimit"
	"github.com/extauthz/extauthz/internal/counters"
	"github.com/extauthz/extauthz/internal/engine"
	"github.com/extauthz/extauthz/internal/httpauth"
	"github.com/extauthz/extauthz/internal/metrics"
	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/local"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
	"github.com/extauthz/extauthz/internal/rlqs"
	"github.com/extauthz/extauthz/internal/rls"
	"github.com/extauthz/extauthz/internal/rlsconfig"
	"github.com/extauthz/extauthz/internal/tracing"
)

// Options are the serve command's settings that are not in the
// configuration file.
type Options struct {
	// Load reads the configuration file at a reload, as it was read at
	// start-up (with the listen addresses given by flag in place of the
	// file's, so a reload does not take the file's for a change).
	Load       func(path string) (*config.Config, error)
	Version    string        // in the serving log line and extauthz_build_info
	DrainDelay time.Duration // on SIGTERM, NOT_SERVING this long before closing listeners
	Grace      time.Duration // on SIGTERM, how long in-flight requests have
	Pprof      bool          // net/http/pprof on the admin listener
	// DecisionLogEvery logs one decision in this many at debug level (0: none).
	DecisionLogEvery int
	// GRPCOptions are added to the gRPC server's (envoyproxy/ratelimit's
	// GRPC_MAX_CONNECTION_AGE, for one).
	GRPCOptions []grpc.ServerOption
	// RLS is where the rate limit service's descriptors come from at a
	// reload of the main configuration; nil: the files its rls.domains
	// names (rlsconfig.LoadFor). Over xDS it is the last configuration the server
	// sent, checked again under the new main configuration.
	RLS func(cfg *config.Config) (*rlsconfig.Config, error)
	// HealthyWithConfig reports NOT_SERVING (and /healthcheck fails)
	// until descriptors of at least one domain are loaded, as
	// envoyproxy/ratelimit's HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED.
	HealthyWithConfig bool
	// Prometheus, when set, serves metrics on a listener of its own
	// (envoyproxy/ratelimit's USE_PROMETHEUS, PROMETHEUS_ADDR).
	Prometheus *PrometheusListener
	// AnchorStats, when set, counts the rate limit service's decisions
	// and descriptor loads in envoyproxy/ratelimit's stats too (served
	// by the Prometheus listener's Gatherer).
	AnchorStats *anchorstats.Stats
}

// PrometheusListener is a metrics listener apart from the admin one.
type PrometheusListener struct {
	Addr, Path string
	// Gatherer builds what it serves from the process's registry (nil:
	// the registry itself).
	Gatherer func(reg *prometheus.Registry) prometheus.Gatherer
}

// adminIdleTimeout closes an admin connection idle this long.
const adminIdleTimeout = 15 * time.Second

// Sidecar is the running process: servers, the doors, the caches.
type Sidecar struct {
	opts    Options
	log     *slog.Logger
	reg     *prometheus.Registry
	reloads *prometheus.CounterVec // configuration reloads by result
	running *engine.Running        // the configuration every door decides with
	rls     *rls.Server
	rlqs    *rlqs.Server
	grpc    *grpc.Server
	http    *http.Server // the HTTP door; nil without listen.http
	health  *health.Server
	admin   *http.Server
	prom    *http.Server // the Prometheus listener; nil without Options.Prometheus
	ready   atomic.Bool
	tracer  *tracing.Tracer // nil unless OTEL_* turns tracing on
	// closeStores releases what talks to Redis (nothing without a redis
	// section), once the doors stopped.
	closeStores func()
	// counters is the counters API on the admin listener.
	counters *counters.Handler
	// conns counts the gRPC and HTTP listeners' connections against
	// listen.max_connections.
	conns *connlimit.Metrics
	// swapMu makes reloads of the main configuration and updates of the
	// descriptors (over xDS) one at a time: each compiles against the
	// other's running half.
	swapMu sync.Mutex
	// started: Start reported SERVING; health follows it and the
	// descriptors (HealthyWithConfig).
	started atomic.Bool

	// Set by Start.
	errc       chan error  // a server that stopped on its own
	pending    chan string // a reload to run (one slot), by its trigger
	reloadStop chan struct{}
	watch      *watcher
	addrs      addrs
}

// New wires the process for cfg and rc: it connects to Redis when cfg has
// a redis section and builds every door, without listening yet (see
// Start). On an error, what it connected is released.
func New(cfg *config.Config, rc *rlsconfig.Config, o Options, log *slog.Logger) (*Sidecar, error) {
	reg := metrics.New(o.Version)
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metrics.Namespace, Name: "config_reloads_total",
		Help: "Configuration reloads by result (success, failure).",
	}, []string{"result"})
	reloads.WithLabelValues("success")
	reloads.WithLabelValues("failure")
	reg.MustRegister(reloads)
	counts, err := local.NewTable(cfg.Local.MaxKeys)
	if err != nil {
		return nil, err
	}
	tables := map[string]metrics.TableStats{"counts": counts}
	limiters := engine.Limiters{config.ModeLocal: local.New(counts)}
	s := &Sidecar{opts: o, log: log, reg: reg, reloads: reloads, health: health.NewServer(), closeStores: func() {}, conns: connlimit.NewMetrics(reg)}
	var stores *redisParts // nil without a redis section
	if cfg.Redis != nil {
		stores, err = connectRedis(cfg, counts, reg, log)
		if err != nil {
			return nil, err
		}
		tables["redis"] = stores.Table
		limiters[config.ModeRedis] = stores.Redis
		limiters[config.ModeHybrid] = stores.Hybrid
		s.closeStores = func() { stores.close(log) }
	}
	// From here on, a failure releases what talks to Redis.
	built := false
	defer func() {
		if !built {
			s.closeStores()
		}
	}()
	metrics.Tables(reg, tables)
	s.tracer, err = tracing.FromEnv(context.Background(), o.Version, log)
	if err != nil {
		return nil, err
	}
	// One engine's metrics for every door: decisions count by policy
	// whichever door asked, and requests by door. Every door decides with
	// one Running: a reload compiles it once (the rate limit service
	// compiles its descriptors beside it).
	m := engine.NewMetrics(reg)
	s.running, err = engine.NewRunning(cfg, limiters, m, engine.WithWarnings(log))
	if err != nil {
		return nil, err
	}
	rlsOpts := []rls.Option{rls.WithLog(log), rls.WithMetrics(rls.NewMetrics(reg))}
	if o.AnchorStats != nil {
		rlsOpts = append(rlsOpts, rls.WithAnchorStats(o.AnchorStats))
	}
	s.rls, err = rls.New(s.running, rc, rlsOpts...)
	if err != nil {
		return nil, err
	}
	s.rlqs = rlqs.New(s.running, rlqs.WithLog(log), rlqs.WithMetrics(rlqs.NewMetrics(reg)))
	srv := check.NewServer(s.running, check.WithDecisionLog(log, o.DecisionLogEvery), check.WithTracer(s.tracer))
	if cfg.Listen.HTTP != "" {
		s.http = &http.Server{
			Handler: httpauth.New(s.running, httpauth.WithLog(log)),
			// Proxies keep connections to the door open between auth
			// requests; they close idle ones first (nginx's upstream
			// keepalive_timeout is 60s), so a request never races our close.
			IdleTimeout:       5 * time.Minute,
			ReadHeaderTimeout: 10 * time.Second,
			// Go's default, stated: far above what the proxies pass on
			// (Envoy 60 KiB, nginx 32 KiB of headers by default).
			MaxHeaderBytes: http.DefaultMaxHeaderBytes,
			ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}
	}
	s.counters = &counters.Handler{
		Engine:  s.running.Engine,
		Forget:  forgetEverywhere(limiters),
		Token:   counters.TokenDigest(os.Getenv(counters.TokenEnv)),
		Log:     log,
		Metrics: counters.NewMetrics(reg),
	}
	if stores != nil {
		// Resets through another replica's API reach this one (and
		// this one's reach them) over Redis pub/sub.
		stores.resets = redisstore.NewResets(stores.clients.Client, cfg.Redis.KeyPrefix, stores.Peers.ID(), s.counters.ForgetAnnounced, time.Second, log)
		s.counters.Publish = stores.resets.Publish
	}
	opts := check.ServerOptions()
	if cfg.Listen.TLS != nil {
		tc, err := serverTLS(cfg.Listen.TLS)
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	s.grpc = grpc.NewServer(append(opts, o.GRPCOptions...)...)
	authv3.RegisterAuthorizationServer(s.grpc, srv)
	rlsv3.RegisterRateLimitServiceServer(s.grpc, s.rls)
	rlqsv3.RegisterRateLimitQuotaServiceServer(s.grpc, s.rlqs)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	if cfg.Listen.Reflection {
		reflection.Register(s.grpc)
	}
	built = true
	return s, nil
}

// listen opens addr: host:port, or unix:///path (a stale socket file is
// replaced).
func listen(addr string) (net.Listener, error) {
	if path, ok := strings.CutPrefix(addr, "unix://"); ok {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		return net.Listen("unix", path)
	}
	return net.Listen("tcp", addr)
}

// Run serves until SIGTERM or SIGINT, reloading on SIGHUP and on a change
// to the configuration files, then shuts down (a second signal stops at
// once). It returns the process's exit code.
func (s *Sidecar) Run() (int, error) {
	// Signals are caught before Start logs "serving": whoever waits for
	// that line may signal at once.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	if err := s.Start(); err != nil {
		return 1, err
	}
	for {
		select {
		case err := <-s.errc:
			s.stopReloads()
			return 1, fmt.Errorf("server stopped: %w", err)
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				s.trigger("SIGHUP")
				continue
			}
			s.log.Info("shutting down", "signal", sig.String())
			hurry := make(chan struct{})
			go func() { <-sigs; close(hurry) }()
			return s.Shutdown(hurry), nil
		}
	}
}

// Start opens the listeners, serves on them, reports SERVING, starts
// watching the configuration files and logs "serving". A server that
// stops on its own afterwards is reported to Run.
func (s *Sidecar) Start() error {
	cfg := s.running.Config()
	glis, err := listen(cfg.Listen.GRPC)
	if err != nil {
		return fmt.Errorf("listen.grpc: %w", err)
	}
	// The doors' listeners hold at most listen.max_connections each; the
	// admin listener is not capped (scrapers and operators, on loopback).
	glis = connlimit.Wrap(glis, "grpc", cfg.Listen.MaxConnections, s.conns, s.log)
	var hlis, alis net.Listener
	if s.http != nil {
		hlis, err = listen(cfg.Listen.HTTP)
		if err != nil {
			glis.Close()
			return fmt.Errorf("listen.http: %w", err)
		}
		hlis = connlimit.Wrap(hlis, "http", cfg.Listen.MaxConnections, s.conns, s.log)
	}
	if cfg.Listen.Admin != "" {
		alis, err = listen(cfg.Listen.Admin)
		if err != nil {
			glis.Close()
			if hlis != nil {
				hlis.Close()
			}
			return fmt.Errorf("listen.admin: %w", err)
		}
		s.admin = &http.Server{
			Handler:           s.adminMux(),
			ReadHeaderTimeout: 5 * time.Second,
			// Scrapers come back every 15 s or more; a connection idle
			// longer is closed rather than held (a scraper reconnects).
			// No ReadTimeout or WriteTimeout: /debug/pprof/profile
			// answers after its ?seconds.
			IdleTimeout: adminIdleTimeout,
			// net/http's own lines (http: Accept error, TLS handshake
			// errors) are structured like every other.
			ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		}
	}

	var plis net.Listener
	if p := s.opts.Prometheus; p != nil {
		plis, err = listen(p.Addr)
		if err != nil {
			for _, l := range []net.Listener{glis, hlis, alis} {
				if l != nil {
					l.Close()
				}
			}
			return fmt.Errorf("prometheus listener: %w", err)
		}
		var g prometheus.Gatherer = s.reg
		if p.Gatherer != nil {
			g = p.Gatherer(s.reg)
		}
		mux := http.NewServeMux()
		mux.Handle(p.Path, promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
		s.prom = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: adminIdleTimeout,
			ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
	}

	s.errc = make(chan error, 4)
	go func() { s.errc <- s.grpc.Serve(glis) }()
	serveHTTP := func(srv *http.Server, lis net.Listener) {
		if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			s.errc <- err
		}
	}
	if s.http != nil {
		go serveHTTP(s.http, hlis)
	}
	if s.admin != nil {
		go serveHTTP(s.admin, alis)
	}
	if s.prom != nil {
		go serveHTTP(s.prom, plis)
	}
	s.started.Store(true)
	s.updateHealth()
	adminAddr, httpAddr := "", ""
	if alis != nil {
		adminAddr = alis.Addr().String()
	}
	if hlis != nil {
		httpAddr = hlis.Addr().String()
	}
	s.addrs = addrs{grpc: glis.Addr().String(), http: httpAddr, admin: adminAddr}
	promAddr := ""
	if plis != nil {
		promAddr = plis.Addr().String()
	}
	// Reloads run one at a time on a goroutine of their own, never on the
	// signal loop: reading and checking a file can take long (a slow
	// volume, a hostile file, a FIFO nobody writes), and SIGTERM must
	// always be answered at once. A trigger while one is pending is folded
	// into it.
	s.pending = make(chan string, 1)
	s.reloadStop = make(chan struct{})
	go func() {
		for {
			select {
			case why := <-s.pending:
				s.Reload(why)
			case <-s.reloadStop:
				return
			}
		}
	}()
	// The file watch is in place before "serving" is logged: whoever
	// waits for that line may edit at once.
	s.watch = newWatcher(s.log, func() { s.trigger("file changed") })
	s.watch.watch(sourcesOf(cfg), loadedSum(cfg, s.rls.Config()))
	redisAddrs := "none"
	if cfg.Redis != nil {
		redisAddrs = strings.Join(cfg.Redis.Addrs, ",")
		if sc := cfg.Redis.Sentinel; sc != nil {
			redisAddrs = "sentinel:" + sc.MasterName + "@" + strings.Join(sc.Addrs, ",")
		}
	}
	s.log.Info("serving", "grpc", glis.Addr().String(), "http", httpAddr, "admin", adminAddr, "prometheus", promAddr,
		"config", cfg.Source, "policies", len(cfg.Policies), "default_mode", string(cfg.DefaultMode),
		"redis", redisAddrs, "client_keys", len(cfg.Clients.Keys), "max_keys", cfg.Local.MaxKeys,
		"rls_domains", rlsDomains(s.rls.Config()), "version", s.opts.Version)
	return nil
}

// updateHealth reports SERVING once started, unless descriptors must be
// loaded first (HealthyWithConfig) and are not.
func (s *Sidecar) updateHealth() {
	if !s.started.Load() {
		return
	}
	st := healthpb.HealthCheckResponse_SERVING
	if s.opts.HealthyWithConfig && rlsDomains(s.rls.Config()) == 0 {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(authv3.Authorization_ServiceDesc.ServiceName, st)
	s.health.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, st)
	s.health.SetServingStatus(rlqsv3.RateLimitQuotaService_ServiceDesc.ServiceName, st)
	s.ready.Store(st == healthpb.HealthCheckResponse_SERVING)
}

// UpdateRLS makes the rate limit service's descriptors what load returns
// under the running main configuration (an update over xDS): checked and
// compiled, then swapped in at once, as a reload swaps them. On error the
// running descriptors stay; the error is counted as a failed reload and
// returned (for the NACK).
func (s *Sidecar) UpdateRLS(why string, load func(cfg *config.Config) (*rlsconfig.Config, error)) error {
	s.swapMu.Lock()
	defer s.swapMu.Unlock()
	cfg := s.running.Config()
	rc, err := load(cfg)
	if err == nil {
		err = s.rls.Update(cfg, rc)
	}
	s.anchorLoad(err)
	if err != nil {
		s.reloads.WithLabelValues("failure").Inc()
		s.log.Error("descriptor update refused; keeping the running descriptors", "trigger", why, "error", err.Error())
		return err
	}
	s.reloads.WithLabelValues("success").Inc()
	for _, w := range rlsconfig.WarningsOf(rc) {
		s.log.Warn("config warning", "source", why, "warning", w)
	}
	s.log.Info("descriptors updated", "trigger", why, "rls_domains", rlsDomains(rc))
	s.updateHealth()
	return nil
}

// anchorLoad counts a load of the descriptors in envoyproxy/ratelimit's
// stats (config_load_success, config_load_error), when they are kept.
func (s *Sidecar) anchorLoad(err error) {
	if s.opts.AnchorStats != nil {
		s.opts.AnchorStats.ConfigLoad(err == nil)
	}
}

// addrs are the addresses Start listens on ("": that listener is off).
type addrs struct{ grpc, http, admin string }

// trigger asks the reload goroutine for a reload.
func (s *Sidecar) trigger(why string) {
	select {
	case s.pending <- why:
	default: // one is pending already; it will read the files as they are then
	}
}

// Reload re-reads the configuration file and the rate limit service's
// domain files. An invalid file keeps the running configuration of every
// door, and the error is logged, counted and returned. Run calls it one
// at a time, off the signal loop.
func (s *Sidecar) Reload(why string) error {
	src := s.running.Config().Source
	if src == config.EmbeddedSource {
		s.log.Warn("reload ignored: serving the embedded default configuration, not a file")
		return nil
	}
	s.swapMu.Lock()
	defer s.swapMu.Unlock()
	s.log.Info("reloading configuration", "trigger", why, "config", src)
	running := s.running.Config()
	cfg, err := s.opts.Load(src)
	var rc *rlsconfig.Config
	if err == nil {
		load := rlsconfig.LoadFor
		if s.opts.RLS != nil {
			load = s.opts.RLS
		}
		rc, err = load(cfg)
	}
	if err == nil {
		err = swap(
			func() (func(), error) { return s.running.Prepare(cfg) }, // Check and the HTTP door
			func() (func(), error) { return s.rls.Prepare(cfg, rc) },
		)
	}
	s.anchorLoad(err)
	if err != nil {
		s.reloads.WithLabelValues("failure").Inc()
		s.log.Error("reload failed; keeping the running configuration", "trigger", why, "error", err.Error())
		return err
	}
	warnRestartOnly(s.log, running, cfg)
	for _, w := range append(cfg.Warnings, rlsconfig.WarningsOf(rc)...) {
		s.log.Warn("config warning", "source", cfg.Source, "warning", w)
	}
	if !slices.Equal(running.RLS.Domains, cfg.RLS.Domains) && s.watch != nil {
		// Other domain files: watch them instead.
		s.watch.watch(sourcesOf(cfg), loadedSum(cfg, rc))
	}
	s.reloads.WithLabelValues("success").Inc()
	s.log.Info("configuration reloaded", "trigger", why, "config", src, "policies", len(cfg.Policies), "rls_domains", rlsDomains(rc))
	s.updateHealth()
	return nil
}

// swap is a reload's transaction over the doors: it prepares each door's
// next configuration and commits them only once every one compiled, so
// every door changes configuration or none does, whatever their order.
func swap(doors ...func() (commit func(), err error)) error {
	commits := make([]func(), 0, len(doors))
	for _, prepare := range doors {
		commit, err := prepare()
		if err != nil {
			return err
		}
		commits = append(commits, commit)
	}
	for _, commit := range commits {
		commit()
	}
	return nil
}

// rlsDomains reads a descriptor configuration that may be nil (no domain
// files).
func rlsDomains(rc *rlsconfig.Config) int {
	if rc == nil {
		return 0
	}
	return len(rc.Domains)
}

// warnRestartOnly logs the settings a reload cannot change.
func warnRestartOnly(log *slog.Logger, running, next *config.Config) {
	var fields []string
	if running.Listen != next.Listen {
		fields = append(fields, "listen")
	}
	if !reflect.DeepEqual(running.Redis, next.Redis) {
		fields = append(fields, "redis")
	}
	if running.Local != next.Local {
		fields = append(fields, "local")
	}
	if running.Fallback != next.Fallback {
		fields = append(fields, "fallback")
	}
	if len(fields) > 0 {
		log.Warn("reload: these sections changed and take effect after a restart", "sections", strings.Join(fields, ", "))
	}
}

// Shutdown reports NOT_SERVING, waits out the drain delay, then stops
// every door gracefully within the grace period: no new connections, and
// requests in flight answered. Only then does it release Redis (so a
// request in flight can still count) and export the last spans; the
// admin listener closes last, so /metrics and /readyz answer throughout.
// Closing hurry stops at once (Run closes it on a second signal). It
// returns the process's exit code: 1 when stopped at once during the
// drain delay.
func (s *Sidecar) Shutdown(hurry <-chan struct{}) int {
	defer s.stopReloads()
	s.ready.Store(false)
	s.health.Shutdown() // every service NOT_SERVING
	if s.opts.DrainDelay > 0 {
		select {
		case <-time.After(s.opts.DrainDelay):
		case <-hurry:
			s.stopNow()
			return 1
		}
	}
	done := make(chan struct{})
	go func() {
		var wg sync.WaitGroup
		// Envoy's quota streams last as long as Envoy runs: end them
		// (Envoy reopens one elsewhere; its assignments stay in force
		// until they end), so the graceful stop waits only for calls.
		s.rlqs.Close()
		wg.Go(s.grpc.GracefulStop)
		if s.http != nil {
			// Closes the listener and idle connections, then waits for
			// requests in flight; stopNow cuts it short.
			wg.Go(func() { s.http.Shutdown(context.Background()) })
		}
		wg.Wait()
		close(done)
	}()
	force := time.AfterFunc(s.opts.Grace, s.stopNow)
	select {
	case <-done:
	case <-hurry:
		s.stopNow()
		<-done
	}
	force.Stop()
	s.closeStores()
	// The spans still buffered, the last Checks' among them, leave now.
	tctx, tcancel := context.WithTimeout(context.Background(), 5*time.Second)
	if err := s.tracer.Shutdown(tctx); err != nil {
		s.log.Warn("tracing: exporting the last spans", "error", err.Error())
	}
	tcancel()
	for _, srv := range []*http.Server{s.admin, s.prom} {
		if srv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			srv.Shutdown(ctx)
			cancel()
		}
	}
	s.log.Info("stopped")
	return 0
}

// stopReloads stops the file watch for good and the reload goroutine
// (a reload under way finishes on its own).
func (s *Sidecar) stopReloads() {
	if s.watch != nil {
		s.watch.close()
	}
	if s.reloadStop != nil {
		close(s.reloadStop)
	}
}

// stopNow closes both doors and every connection at once.
func (s *Sidecar) stopNow() {
	s.grpc.Stop()
	if s.http != nil {
		s.http.Close()
	}
}

// forgetEverywhere drops what this process holds of a partition key in
// every limiter: the key's policy may have changed mode in a reload, and
// a Redis-backed key also has a fallback bucket among the local counts.
func forgetEverywhere(limiters engine.Limiters) func(partition string) {
	return func(partition string) {
		for _, lim := range limiters {
			if in, ok := lim.(quota.Inspector); ok {
				in.Forget(partition)
			}
		}
	}
}

func (s *Sidecar) adminMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Handler(s.reg))
	s.counters.Register(mux)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	// envoyproxy/ratelimit's health endpoint, which Envoy Gateway's
	// probes ask: OK while serving, 500 before and while draining.
	mux.HandleFunc("/healthcheck", func(w http.ResponseWriter, r *http.Request) {
		if !s.ready.Load() {
			http.Error(w, "unhealthy", http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, "OK")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if !s.ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	if s.opts.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}
