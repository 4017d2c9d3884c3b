package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/extauthz/extauthz/internal/anchorstats"
	"github.com/extauthz/extauthz/internal/certfile"
	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/gctune"
	"github.com/extauthz/extauthz/internal/rlsconfig"
	"github.com/extauthz/extauthz/internal/rlsenv"
	"github.com/extauthz/extauthz/internal/rlsxds"
	"github.com/extauthz/extauthz/internal/sidecar"
)

// argv0 is the name the process was started by: as ratelimit (Envoy
// Gateway's /bin/ratelimit), it reads envoyproxy/ratelimit's environment.
var argv0 = "extauthz"

// ratelimitEnv reports whether serve and validate read envoyproxy/ratelimit's
// environment: started as ratelimit, or with CONFIG_TYPE set.
func ratelimitEnv() bool { return rlsenv.Active(argv0, os.LookupEnv) }

// runRatelimit serves as envoyproxy/ratelimit would in this environment.
// It takes no arguments, as the anchor takes none.
func runRatelimit(e env, args []string) (int, error) {
	if len(args) > 0 {
		return 2, fmt.Errorf("%w: started as %s or with %s set, extauthz takes its settings from envoyproxy/ratelimit's environment; unexpected argument %q (run `%s validate` to see what it reads)",
			errUsage, rlsenv.Binary, rlsenv.ConfigTypeVar, args[0], argv0)
	}
	re, err := rlsenv.Read(os.LookupEnv)
	if err != nil {
		return 1, err
	}
	log := envLogger(e, re)
	if err := re.Export(os.LookupEnv, os.Setenv); err != nil {
		return 1, err
	}
	cfg, err := re.Config()
	if err != nil {
		return 1, err
	}
	for _, w := range cfg.Warnings {
		log.Warn("config warning", "source", cfg.Source, "warning", w)
	}
	opts := sidecar.Options{
		Load:    func(string) (*config.Config, error) { return re.Config() },
		Version: buildVersion(),
		Grace:   10 * time.Second,
		GRPCOptions: []grpc.ServerOption{grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionAge: re.MaxConnectionAge, MaxConnectionAgeGrace: re.MaxConnectionAgeGrace,
		})},
		HealthyWithConfig: re.HealthyWithConfig,
	}
	if p := re.Prometheus; p != nil {
		if opts.AnchorStats, err = anchorstats.New(p.MapperYAML, p.NearLimitRatio); err != nil {
			return 1, fmt.Errorf("PROMETHEUS_MAPPER_YAML: %w", err)
		}
		// The anchor's series beside extauthz's own, on the listener the
		// anchor serves them on.
		anchorReg := prometheus.NewRegistry()
		anchorReg.MustRegister(opts.AnchorStats)
		opts.Prometheus = &sidecar.PrometheusListener{Addr: p.Addr, Path: p.Path,
			Gatherer: func(reg *prometheus.Registry) prometheus.Gatherer { return prometheus.Gatherers{reg, anchorReg} }}
	}
	var rc *rlsconfig.Config
	switch re.ConfigType {
	case rlsenv.ConfigFile:
		if rc, err = rlsconfig.LoadFor(cfg); err != nil {
			return 1, err
		}
		if opts.AnchorStats != nil {
			opts.AnchorStats.ConfigLoad(true) // the first load, as the anchor counts it
		}
		for _, w := range rlsconfig.WarningsOf(rc) {
			log.Warn("config warning", "source", cfg.Source, "warning", w)
		}
	case rlsenv.ConfigXDS:
		return serveXDS(re, cfg, opts, log)
	}
	log.Debug("garbage collector", "gogc", gctune.Apply())
	s, err := sidecar.New(cfg, rc, opts, log)
	if err != nil {
		return 1, err
	}
	return s.Run()
}

// serveXDS serves with descriptors over xDS: it subscribes, waits for the
// first configuration unless FORCE_START_WITHOUT_INITIAL_CONFIG is set
// (then it serves at once, with no limits until one arrives), and swaps
// in every update after that. As the anchor, it opens no listener while
// it waits, however long the server is away, and a refused first update
// (NACKed) ends the wait with no descriptors.
func serveXDS(re *rlsenv.Env, cfg *config.Config, opts sidecar.Options, log *slog.Logger) (int, error) {
	x := re.XDS
	xo := rlsxds.Options{
		ServerURL: x.ServerURL, NodeID: x.NodeID, NodeMetadata: x.NodeMetadata, Headers: x.Headers,
		BackoffInitial: x.BackoffInitial, BackoffMax: x.BackoffMax, BackoffFactor: x.BackoffFactor, Jitter: x.BackoffJitter,
		MaxMsgSize: x.MaxMsgSize, Log: log,
	}
	if t := x.TLS; t != nil {
		var keys *certfile.KeyPair
		var roots *certfile.Pool
		var err error
		if t.CertFile != "" {
			if keys, err = certfile.NewKeyPair(t.CertFile, t.KeyFile); err != nil {
				return 1, fmt.Errorf("CONFIG_GRPC_XDS_CLIENT_TLS_CERT/KEY: %w", err)
			}
		}
		if t.CAFile != "" {
			if roots, err = certfile.NewPool(t.CAFile); err != nil {
				return 1, fmt.Errorf("CONFIG_GRPC_XDS_SERVER_TLS_CACERT: %w", err)
			}
		}
		name := t.ServerName
		if name == "" {
			name, _, _ = net.SplitHostPort(x.ServerURL)
		}
		xo.TLS = certfile.Client(keys, roots, name, tls.VersionTLS13)
	}

	// current is the last good update, which a reload of the main
	// configuration checks again (read without mu: a reload holds the
	// sidecar's lock, which an update under mu waits for). mu orders
	// updates with the sidecar's creation, so none is lost between the
	// two.
	var (
		current atomic.Pointer[rlsxds.Set]
		mu      sync.Mutex
		side    *sidecar.Sidecar // guarded by mu
		first   = make(chan struct{})
		once    sync.Once
	)
	loadCurrent := func(c *config.Config) (*rlsconfig.Config, error) {
		return current.Load().Load(rlsconfig.OptionsFor(c))
	}
	xo.Apply = func(set *rlsxds.Set) error {
		mu.Lock()
		defer mu.Unlock()
		if side != nil {
			if err := side.UpdateRLS("xds", func(c *config.Config) (*rlsconfig.Config, error) {
				return set.Load(rlsconfig.OptionsFor(c))
			}); err != nil {
				return err
			}
		} else if _, err := set.Load(rlsconfig.OptionsFor(cfg)); err != nil {
			log.Error("xds: update refused (NACK)", "error", err.Error())
			if opts.AnchorStats != nil {
				opts.AnchorStats.ConfigLoad(false)
			}
			// The anchor waits for the first update, not the first good
			// one: refused, it starts with no descriptors.
			once.Do(func() { close(first) })
			return err
		} else if opts.AnchorStats != nil {
			opts.AnchorStats.ConfigLoad(true)
		}
		current.Store(set)
		once.Do(func() { close(first) })
		return nil
	}
	opts.RLS = loadCurrent
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go rlsxds.Run(ctx, xo)
	if !re.ForceStart {
		// No listener is open yet, so nothing else stops the process: a
		// SIGTERM while waiting ends it cleanly. The handler is in place
		// before the line that says the process waits.
		stop, unstop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		log.Info("xds: waiting for the first configuration before serving (FORCE_START_WITHOUT_INITIAL_CONFIG is off)", "server", x.ServerURL)
		select {
		case <-first:
			unstop()
		case <-stop.Done():
			unstop()
			log.Info("stopped before the first configuration arrived")
			return 0, nil
		}
	}
	mu.Lock()
	rc, err := loadCurrent(cfg)
	if err == nil {
		side, err = sidecar.New(cfg, rc, opts, log)
	}
	mu.Unlock()
	if err != nil {
		return 1, err
	}
	return side.Run()
}

// envLogger logs as LOG_LEVEL and LOG_FORMAT say.
func envLogger(e env, re *rlsenv.Env) *slog.Logger {
	o := &slog.HandlerOptions{Level: re.LogLevel}
	if re.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(e.stderr, o))
	}
	return slog.New(slog.NewTextHandler(e.stderr, o))
}

// validateRatelimit explains the environment and checks what it names:
// the configuration it makes and, with CONFIG_TYPE=FILE, the descriptor
// files. Over xDS the descriptors are checked as they arrive.
func validateRatelimit(e env) (int, error) {
	re, err := rlsenv.Read(os.LookupEnv)
	if err != nil {
		fmt.Fprintln(e.stderr, err)
		return 1, nil
	}
	re.Explain(e.stdout)
	cfg, err := re.Config()
	var rc *rlsconfig.Config
	if err == nil && re.ConfigType == rlsenv.ConfigFile {
		rc, err = rlsconfig.LoadFor(cfg)
	}
	if err != nil {
		fmt.Fprintln(e.stderr, err)
		return 1, nil
	}
	for _, w := range append(cfg.Warnings, rlsconfig.WarningsOf(rc)...) {
		fmt.Fprintf(e.stderr, "warning: %s\n", w)
	}
	fmt.Fprintf(e.stdout, "\n%s: ok\n", cfg.Source)
	for _, f := range rlsFiles(rc) {
		fmt.Fprintf(e.stdout, "%s: ok\n", f)
	}
	printSummary(e.stdout, cfg)
	printRLSSummary(e.stdout, rc)
	return 0, nil
}
