package main

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
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/extauthz/extauthz/internal/check"
	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/engine"
	"github.com/extauthz/extauthz/internal/gctune"
	"github.com/extauthz/extauthz/internal/metrics"
	"github.com/extauthz/extauthz/internal/quota/local"
	"github.com/extauthz/extauthz/internal/tracing"
)

// ConfigEnv names the configuration file when -config is not given.
const ConfigEnv = "EXTAUTHZ_CONFIG"

func init() {
	register(command{
		name:  "serve",
		usage: "[-config FILE] [-log-format text|json] [-log-level LEVEL] [-listen-grpc ADDR] [-listen-admin ADDR] [-drain-delay D] [-grace D] [-pprof] [-decision-log-every N]",
		short: "run the sidecar (the default command)",
		run:   runServe,
	})
}

type serveFlags struct {
	config     string
	logFormat  string
	logLevel   string
	drainDelay time.Duration
	grace      time.Duration
	pprof      bool
	sampleLog  int
	listen     listenOverrides // -listen-grpc, -listen-admin (cli.go)
}

func runServe(e env, args []string) (int, error) {
	fs := newFlags("serve", e)
	var f serveFlags
	fs.StringVar(&f.config, "config", "", "configuration file (default: the embedded default configuration)")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.DurationVar(&f.drainDelay, "drain-delay", 0, "on SIGTERM, report NOT_SERVING this long before closing listeners")
	fs.DurationVar(&f.grace, "grace", 10*time.Second, "on SIGTERM, wait this long for in-flight Checks before stopping")
	fs.BoolVar(&f.pprof, "pprof", false, "serve net/http/pprof under /debug/pprof/ on the admin address")
	fs.IntVar(&f.sampleLog, "decision-log-every", 100, "with -log-level debug, log one decision in this many (0: none)")
	fs.StringVar(&f.listen.grpc, "listen-grpc", "", "serve Check here instead of the file's listen.grpc (host:port or unix:///path)")
	fs.StringVar(&f.listen.admin, "listen-admin", "", "serve /metrics, /healthz, /readyz here instead of the file's listen.admin")
	if err := envDefaults(fs, os.LookupEnv); err != nil {
		return 2, fmt.Errorf("%w: %v", errUsage, err)
	}
	if err := fs.Parse(args); err != nil {
		return 2, err
	}
	if fs.NArg() > 0 {
		return 2, fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	log, err := newLogger(e, f.logFormat, f.logLevel)
	if err != nil {
		return 2, fmt.Errorf("%w: %v", errUsage, err)
	}
	if f.config == "" {
		f.config = os.Getenv(ConfigEnv)
	}

	var cfg *config.Config
	if f.config == "" {
		cfg = config.Default()
		if err := f.listen.apply(cfg); err != nil {
			return 2, fmt.Errorf("%w: %v", errUsage, err)
		}
		fmt.Fprintf(e.stderr, "extauthz: no -config and no $%s: serving the embedded default configuration (local mode, no Redis)\n", ConfigEnv)
		printSummary(e.stderr, cfg)
		fmt.Fprintf(e.stderr, "try: extauthz check -H 'x-api-key: key-demo-123' GET /orders   (the 6th call in a minute gets 429)\n")
		fmt.Fprintf(e.stderr, "     extauthz check GET /   (no key: anonymous callers share 10 a minute)\n\n")
	} else {
		cfg, err = f.listen.load(f.config)
		if err != nil {
			return 1, err
		}
	}
	for _, w := range cfg.Warnings {
		log.Warn("config warning", "source", cfg.Source, "warning", w)
	}

	log.Debug("garbage collector", "gogc", gctune.Apply())
	s, err := newSidecar(cfg, f, log)
	if err != nil {
		return 1, err
	}
	return s.run()
}

func newLogger(e env, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("-log-level %q: choices are debug, info, warn, error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(e.stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(e.stderr, opts)), nil
	}
	return nil, fmt.Errorf("-log-format %q: choices are text, json", format)
}

// sidecar is the running process: servers, the Check service, the caches.
type sidecar struct {
	flags   serveFlags
	log     *slog.Logger
	reg     *prometheus.Registry
	reloads *prometheus.CounterVec // configuration reloads by result
	checks  *check.Server
	grpc    *grpc.Server
	health  *health.Server
	admin   *http.Server
	ready   atomic.Bool
	redis   *redisParts     // nil without a redis section
	tracer  *tracing.Tracer // nil unless OTEL_* turns tracing on
}

func newSidecar(cfg *config.Config, f serveFlags, log *slog.Logger) (*sidecar, error) {
	reg := metrics.New(buildVersion())
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
	s := &sidecar{flags: f, log: log, reg: reg, reloads: reloads, health: health.NewServer()}
	if cfg.Redis != nil {
		s.redis, err = connectRedis(cfg, counts, reg, log)
		if err != nil {
			return nil, err
		}
		tables["redis"] = s.redis.table
		limiters[config.ModeRedis] = s.redis.redisMode
		limiters[config.ModeHybrid] = s.redis.hybridMode
	}
	metrics.Tables(reg, tables)
	s.tracer, err = tracing.FromEnv(context.Background(), buildVersion(), log)
	if err != nil {
		s.redis.close(log)
		return nil, err
	}
	srv, err := check.New(cfg, limiters, engine.NewMetrics(reg), check.WithDecisionLog(log, f.sampleLog), check.WithTracer(s.tracer))
	if err != nil {
		s.redis.close(log)
		return nil, err
	}
	s.checks = srv
	opts := check.ServerOptions()
	if cfg.Listen.TLS != nil {
		tc, err := serverTLS(cfg.Listen.TLS)
		if err != nil {
			s.redis.close(log)
			return nil, err
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	s.grpc = grpc.NewServer(opts...)
	authv3.RegisterAuthorizationServer(s.grpc, srv)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	if cfg.Listen.Reflection {
		reflection.Register(s.grpc)
	}
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

func (s *sidecar) run() (int, error) {
	cfg := s.checks.Config()
	glis, err := listen(cfg.Listen.GRPC)
	if err != nil {
		return 1, fmt.Errorf("listen.grpc: %w", err)
	}
	var alis net.Listener
	if cfg.Listen.Admin != "" {
		alis, err = listen(cfg.Listen.Admin)
		if err != nil {
			glis.Close()
			return 1, fmt.Errorf("listen.admin: %w", err)
		}
		s.admin = &http.Server{Handler: s.adminMux(), ReadHeaderTimeout: 5 * time.Second}
	}

	errc := make(chan error, 2)
	go func() { errc <- s.grpc.Serve(glis) }()
	if s.admin != nil {
		go func() {
			if err := s.admin.Serve(alis); !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(authv3.Authorization_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	s.ready.Store(true)
	adminAddr := ""
	if alis != nil {
		adminAddr = alis.Addr().String()
	}
	// Signals and the file watch are in place before "serving" is logged:
	// whoever waits for that line may signal or edit at once.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	reloads := make(chan struct{}, 1)
	if cfg.Source != config.EmbeddedSource {
		stop, err := watchConfig(cfg.Source, cfg.Digest, s.log, func() {
			select {
			case reloads <- struct{}{}:
			default: // one is pending already
			}
		})
		if err != nil {
			s.log.Warn("cannot watch the configuration file; reload with SIGHUP", "config", cfg.Source, "error", err.Error())
		} else {
			defer stop()
		}
	}
	redisAddrs := "none"
	if cfg.Redis != nil {
		redisAddrs = strings.Join(cfg.Redis.Addrs, ",")
	}
	s.log.Info("serving", "grpc", glis.Addr().String(), "admin", adminAddr,
		"config", cfg.Source, "policies", len(cfg.Policies), "default_mode", string(cfg.DefaultMode),
		"redis", redisAddrs, "client_keys", len(cfg.Clients.Keys), "max_keys", cfg.Local.MaxKeys, "version", buildVersion())

	for {
		select {
		case err := <-errc:
			return 1, fmt.Errorf("server stopped: %w", err)
		case <-reloads:
			s.reload("file changed")
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				s.reload("SIGHUP")
				continue
			}
			s.log.Info("shutting down", "signal", sig.String())
			return s.shutdown(sigs), nil
		}
	}
}

// reload re-reads the configuration file. An invalid file keeps the running
// configuration. Reloads run one at a time, on the main loop.
func (s *sidecar) reload(why string) {
	src := s.checks.Config().Source
	if src == config.EmbeddedSource {
		s.log.Warn("reload ignored: serving the embedded default configuration, not a file")
		return
	}
	running := s.checks.Config()
	cfg, err := s.flags.listen.load(src)
	if err == nil {
		err = s.checks.Update(cfg)
	}
	if err == nil {
		warnRestartOnly(s.log, running, cfg)
	}
	if err != nil {
		s.reloads.WithLabelValues("failure").Inc()
		s.log.Error("reload failed; keeping the running configuration", "trigger", why, "error", err.Error())
		return
	}
	s.reloads.WithLabelValues("success").Inc()
	s.log.Info("configuration reloaded", "trigger", why, "config", src, "policies", len(cfg.Policies))
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

// shutdown reports NOT_SERVING, waits out the drain delay, then stops
// gracefully within the grace period. A second signal stops at once.
func (s *sidecar) shutdown(sigs <-chan os.Signal) int {
	s.ready.Store(false)
	s.health.Shutdown() // every service NOT_SERVING
	if s.flags.drainDelay > 0 {
		select {
		case <-time.After(s.flags.drainDelay):
		case <-sigs:
			s.grpc.Stop()
			return 1
		}
	}
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	force := time.AfterFunc(s.flags.grace, s.grpc.Stop)
	select {
	case <-done:
	case <-sigs:
		s.grpc.Stop()
		<-done
	}
	force.Stop()
	s.redis.close(s.log)
	// The spans still buffered, the last Checks' among them, leave now.
	tctx, tcancel := context.WithTimeout(context.Background(), 5*time.Second)
	if err := s.tracer.Shutdown(tctx); err != nil {
		s.log.Warn("tracing: exporting the last spans", "error", err.Error())
	}
	tcancel()
	if s.admin != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s.admin.Shutdown(ctx)
		cancel()
	}
	s.log.Info("stopped")
	return 0
}

func (s *sidecar) adminMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Handler(s.reg))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if !s.ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	if s.flags.pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}
