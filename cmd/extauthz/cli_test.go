package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/extauthz/extauthz/internal/config"
)

func TestTopLevelHelpListsCommandsAndEnvironment(t *testing.T) {
	for _, arg := range []string{"-h", "--help", "-help", "help"} {
		var out, errb bytes.Buffer
		if code := run([]string{arg}, nil, &out, &errb); code != 0 {
			t.Fatalf("extauthz %s: exit %d, stderr %q", arg, code, errb.String())
		}
		for _, want := range []string{"check", "hash-key", "serve", "validate", "version",
			"-listen-grpc", "[$EXTAUTHZ_LOG_LEVEL]", "EXTAUTHZ_LISTEN_ADMIN", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("extauthz %s: output lacks %q:\n%s", arg, want, out.String())
			}
		}
	}
}

func TestHelpCommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"help", "validate"}, nil, &out, &errb); code != 0 || !strings.Contains(out.String(), "-config") {
		t.Fatalf("help validate: exit %d, %q", code, out.String())
	}
	out.Reset()
	if code := run([]string{"help", "nope"}, nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), `unknown command "nope"`) {
		t.Fatalf("help nope: exit %d, stderr %q", code, errb.String())
	}
}

func TestVersionFlag(t *testing.T) {
	defer func(v string) { version = v }(version)
	version = "v9.9.9-test"
	for _, arg := range []string{"--version", "-version", "version"} {
		var out bytes.Buffer
		if code := run([]string{arg}, nil, &out, &out); code != 0 || out.String() != "extauthz v9.9.9-test\n" {
			t.Errorf("extauthz %s: exit %d, %q", arg, code, out.String())
		}
	}
}

// TestEnvDefaults: a variable sets its flag, the command line wins over it,
// and a bad value names the variable.
func TestEnvDefaults(t *testing.T) {
	env := map[string]string{
		"EXTAUTHZ_LOG_LEVEL":   "debug",
		"EXTAUTHZ_LOG_FORMAT":  "json",
		"EXTAUTHZ_LISTEN_GRPC": "unix:///run/x.sock",
		"EXTAUTHZ_GRACE":       "3s",
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	level := fs.String("log-level", "info", "")
	format := fs.String("log-format", "text", "")
	grpcAddr := fs.String("listen-grpc", "", "")
	grace := fs.Duration("grace", 10*time.Second, "")
	drain := fs.Duration("drain-delay", 0, "")
	if err := envDefaults(fs, lookup); err != nil {
		t.Fatal(err)
	}
	if err := fs.Parse([]string{"-log-format", "text"}); err != nil {
		t.Fatal(err)
	}
	if *level != "debug" || *format != "text" || *grpcAddr != "unix:///run/x.sock" || *grace != 3*time.Second || *drain != 0 {
		t.Fatalf("level %q format %q grpc %q grace %v drain %v", *level, *format, *grpcAddr, *grace, *drain)
	}
	if u := fs.Lookup("log-level").Usage; !strings.HasSuffix(u, "[$EXTAUTHZ_LOG_LEVEL]") {
		t.Errorf("usage %q does not name the variable", u)
	}

	env = map[string]string{"EXTAUTHZ_GRACE": "soon"}
	fs = flag.NewFlagSet("t", flag.ContinueOnError)
	fs.Duration("grace", 0, "")
	if err := envDefaults(fs, lookup); err == nil || !strings.Contains(err.Error(), `$EXTAUTHZ_GRACE="soon"`) {
		t.Fatalf("bad value: %v", err)
	}
}

func TestListenOverrides(t *testing.T) {
	cfg := config.Default()
	file := cfg.Listen
	if err := (listenOverrides{}).apply(cfg); err != nil || cfg.Listen != file {
		t.Fatalf("no overrides changed %v to %v (%v)", file, cfg.Listen, err)
	}
	if err := (listenOverrides{grpc: "0.0.0.0:9001", http: "127.0.0.1:8081", admin: "0.0.0.0:9090"}).apply(cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Listen.GRPC != "0.0.0.0:9001" || cfg.Listen.HTTP != "127.0.0.1:8081" || cfg.Listen.Admin != "0.0.0.0:9090" {
		t.Fatalf("listen %+v", cfg.Listen)
	}
	for _, o := range []listenOverrides{{grpc: "9001"}, {admin: "unix:///run/a.sock"}, {grpc: "host:port"}, {http: "8081"}} {
		if err := o.apply(config.Default()); err == nil || !strings.Contains(err.Error(), "-listen-") {
			t.Errorf("%+v: error %v, want one naming the flag", o, err)
		}
	}
}

// validate prints a row per limit of a descriptor with several, each
// with its window and flags.
func TestValidatePrintsEveryLimit(t *testing.T) {
	dir := t.TempDir()
	rl := filepath.Join(dir, "api.yaml")
	main := filepath.Join(dir, "extauthz.yaml")
	if err := os.WriteFile(rl, []byte(`domain: api
descriptors:
  - key: user
    rate_limits:
      - {name: burst, unit: second, requests_per_unit: 10}
      - {window: 5m, requests_per_unit: 200}
      - {unit: day, requests_per_unit: 10000, algorithm: token_bucket}
  - key: half
    rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 2}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(main, []byte("rls: {domains: [api.yaml]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"validate", "-config", main}, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{
		"grpc 127.0.0.1:9001 (reflection on), http off",
		"api     user        10/second      fixed_window  local  name=burst",
		"api     user        200/5 minutes  fixed_window  local  -",
		"api     user        10000/day      token_bucket  local  -",
		"api     half        2/30 seconds   fixed_window  local  -",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
}

// validate's summary names the Sentinel master and the sentinels the
// sidecar asks for it.
func TestValidateSummaryNamesSentinel(t *testing.T) {
	path := t.TempDir() + "/sentinel.yaml"
	cfg := "redis:\n  sentinel: {master_name: rl, addrs: [10.0.0.1:26379, 10.0.0.2:26379]}\ndefault_mode: redis\n"
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"validate", "-config", path}, nil, &out, &errb); code != 0 {
		t.Fatalf("validate: exit %d, stderr %q", code, errb.String())
	}
	if want := `redis master "rl" from sentinels 10.0.0.1:26379,10.0.0.2:26379,`; !strings.Contains(out.String(), want) {
		t.Fatalf("summary lacks %q:\n%s", want, out.String())
	}
}

// validate's summary names where a limit read per request comes from,
// with its default and max.
func TestSummaryPrintsLimitSource(t *testing.T) {
	cfg, err := config.Parse([]byte(`
policies:
  - {name: tenants, key: ["claim:sub"], limit: {claim: rpm, default: 100, max: 1000}, window: 1m}
  - {name: monthly, key: ["claim:sub"], limit: {metadata: {namespace: envoy.filters.http.lua, key: quota}, default: 1000, max: 100000}, window: 1mo, calendar: true}
`), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	printSummary(&out, cfg)
	for _, want := range []string{
		"from claim:rpm (default 100, max 1000) per 1m0s",
		"from metadata:envoy.filters.http.lua/quota (default 1000, max 100000) per calendar month (UTC)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
}
