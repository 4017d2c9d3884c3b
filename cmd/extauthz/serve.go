package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/gctune"
	"github.com/extauthz/extauthz/internal/rlsconfig"
	"github.com/extauthz/extauthz/internal/sidecar"
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
	listen     listenOverrides // -listen-grpc, -listen-http, -listen-admin (cli.go)
}

func runServe(e env, args []string) (int, error) {
	if ratelimitEnv() && !(len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help")) {
		return runRatelimit(e, args)
	}
	fs := newFlags("serve", e)
	var f serveFlags
	fs.StringVar(&f.config, "config", "", "configuration file (default: the embedded default configuration)")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.DurationVar(&f.drainDelay, "drain-delay", 0, "on SIGTERM, report NOT_SERVING this long before closing listeners")
	fs.DurationVar(&f.grace, "grace", 10*time.Second, "on SIGTERM, wait this long for in-flight Checks (gRPC and HTTP) before stopping")
	fs.BoolVar(&f.pprof, "pprof", false, "serve net/http/pprof under /debug/pprof/ on the admin address")
	fs.IntVar(&f.sampleLog, "decision-log-every", 100, "with -log-level debug, log one decision in this many (0: none)")
	fs.StringVar(&f.listen.grpc, "listen-grpc", "", "serve Check here instead of the file's listen.grpc (host:port or unix:///path)")
	fs.StringVar(&f.listen.http, "listen-http", "", "serve the HTTP door here instead of the file's listen.http (host:port or unix:///path)")
	fs.StringVar(&f.listen.admin, "listen-admin", "", "serve /metrics, /healthz, /readyz here instead of the file's listen.admin")
	if err := envDefaults(fs, os.LookupEnv); err != nil {
		return 2, fmt.Errorf("%w: %v", errUsage, err)
	}
	envConfig := f.config // $EXTAUTHZ_CONFIG, for saying where a path came from
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
	source := "-config"
	if f.config != "" && f.config == envConfig {
		source = "$" + ConfigEnv
	}

	var cfg *config.Config
	if f.config == "" {
		// The embedded demo, for `go run ./cmd/extauthz` on a workstation.
		// Its key is published, so it says so loudly; the container image
		// sets $EXTAUTHZ_CONFIG and never gets here.
		cfg = config.Default()
		if err := f.listen.apply(cfg); err != nil {
			return 2, fmt.Errorf("%w: %v", errUsage, err)
		}
		fmt.Fprintf(e.stderr, "extauthz: no -config and no $%s: serving the embedded demo configuration (local mode, no Redis)\n", ConfigEnv)
		printSummary(e.stderr, cfg)
		fmt.Fprintf(e.stderr, "try: extauthz check -H 'x-api-key: key-demo-123' GET /orders   (the 6th call in a minute gets 429)\n")
		fmt.Fprintf(e.stderr, "     extauthz check GET /   (no key: anonymous callers share 10 a minute)\n\n")
		log.Warn("serving the embedded demo configuration, which accepts the published demo key key-demo-123: for trying extauthz out, never for a deployment; give -config FILE or $" + ConfigEnv)
	} else {
		cfg, err = f.listen.load(f.config)
		if errors.Is(err, os.ErrNotExist) {
			return 1, fmt.Errorf("no configuration file at %s (from %s): mount one there or name one with -config FILE; "+
				"the embedded demo configuration (with its published demo key) is served only when neither -config nor $%s is set", f.config, source, ConfigEnv)
		}
		if err != nil {
			return 1, err
		}
	}
	for _, w := range cfg.Warnings {
		log.Warn("config warning", "source", cfg.Source, "warning", w)
	}
	rc, err := rlsconfig.LoadFor(cfg)
	if err != nil {
		return 1, err
	}
	for _, w := range rlsconfig.WarningsOf(rc) {
		log.Warn("config warning", "source", cfg.Source, "warning", w)
	}

	log.Debug("garbage collector", "gogc", gctune.Apply())
	s, err := sidecar.New(cfg, rc, sidecar.Options{
		Load: f.listen.load, Version: buildVersion(),
		DrainDelay: f.drainDelay, Grace: f.grace, Pprof: f.pprof, DecisionLogEvery: f.sampleLog,
	}, log)
	if err != nil {
		return 1, err
	}
	return s.Run()
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
