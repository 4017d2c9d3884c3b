package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/gctune"
	"github.com/extauthz/extauthz/internal/rlsconfig"
	"github.com/extauthz/extauthz/internal/rlsenv"
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
		opts.Prometheus = &sidecar.PrometheusListener{Addr: p.Addr, Path: p.Path}
	}
	var rc *rlsconfig.Config
	switch re.ConfigType {
	case rlsenv.ConfigFile:
		if rc, err = sidecar.LoadRLS(cfg); err != nil {
			return 1, err
		}
		for _, w := range sidecar.RLSWarnings(rc) {
			log.Warn("config warning", "source", cfg.Source, "warning", w)
		}
	case rlsenv.ConfigXDS:
		return 1, errors.New("CONFIG_TYPE=GRPC_XDS_SOTW: not wired yet")
	}
	log.Debug("garbage collector", "gogc", gctune.Apply())
	s, err := sidecar.New(cfg, rc, opts, log)
	if err != nil {
		return 1, err
	}
	return s.Run()
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
		rc, err = sidecar.LoadRLS(cfg)
	}
	if err != nil {
		fmt.Fprintln(e.stderr, err)
		return 1, nil
	}
	for _, w := range append(cfg.Warnings, sidecar.RLSWarnings(rc)...) {
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
