package rlsenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/extauthz/extauthz/internal/config"
)

func lookupOf(kv ...string) Lookup {
	m := map[string]string{}
	for _, s := range kv {
		k, v, _ := strings.Cut(s, "=")
		m[k] = v
	}
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}

// Started as ratelimit, or with CONFIG_TYPE set; not otherwise.
func TestActive(t *testing.T) {
	if !Active("/bin/ratelimit", lookupOf()) || !Active("extauthz", lookupOf("CONFIG_TYPE=FILE")) || Active("/extauthz", lookupOf()) {
		t.Fatal("Active: want true as ratelimit or with CONFIG_TYPE, false otherwise")
	}
}

// The anchor's Redis variables, as its driver reads them.
func TestRedis(t *testing.T) {
	e, err := Read(lookupOf("REDIS_SOCKET_TYPE=tcp", "REDIS_URL=mymaster,10.0.0.1:26379,10.0.0.2:26379", "REDIS_TYPE=SENTINEL",
		"REDIS_AUTH=app:pw", "CACHE_KEY_PREFIX=eg:", "USE_STATSD=false"))
	if err != nil {
		t.Fatal(err)
	}
	rd := e.Redis
	if rd.MasterName != "mymaster" || strings.Join(rd.Addrs, ",") != "10.0.0.1:26379,10.0.0.2:26379" || rd.User != "app" || rd.AuthVar != redisPasswordVar || rd.KeyPrefix != "eg:" {
		t.Fatalf("redis = %+v", rd)
	}
	// user:password: the password alone goes to the variable the
	// configuration names.
	got := map[string]string{}
	if err := e.Export(lookupOf(), func(k, v string) error { got[k] = v; return nil }); err != nil {
		t.Fatal(err)
	}
	if got[redisPasswordVar] != "pw" || got["OTEL_SDK_DISABLED"] != "true" {
		t.Fatalf("exported %v", got)
	}
	cfg, err := e.Config()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Redis == nil || cfg.Redis.Sentinel == nil || cfg.Redis.Sentinel.MasterName != "mymaster" || cfg.Redis.Username != "app" || cfg.Redis.PasswordEnv != redisPasswordVar || cfg.DefaultMode != "redis" {
		t.Fatalf("config redis = %+v, mode %s", cfg.Redis, cfg.DefaultMode)
	}
}

// Each problem names its variable; all are reported at once.
func TestErrorsNameTheVariable(t *testing.T) {
	_, err := Read(lookupOf("REDIS_URL=10.0.0.1:6379", "REDIS_TYPE=cluster", "LOG_LEVEL=loud", "GRPC_SERVER_USE_TLS=true", "USE_STATSD=false", "DEBUG_PORT=6070"))
	for _, want := range []string{
		`REDIS_SOCKET_TYPE: "unix": extauthz connects to Redis over tcp only`,
		"REDIS_TYPE: cluster with one address in REDIS_URL",
		`LOG_LEVEL: "loud" is not a level`,
		"GRPC_SERVER_USE_TLS: is true, which needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY",
		`DEBUG_PORT: is set ("6070"), but extauthz serves no debug listener`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v\nwant %q", err, want)
		}
	}
}

// Unset, USE_STATSD is the anchor's default (true), which extauthz does
// not honour but does not refuse: only a variable set is refused.
func TestStatsdDefaultIsNotAnError(t *testing.T) {
	if _, err := Read(lookupOf()); err != nil {
		t.Fatal(err)
	}
}

// The anchor's environment counts each descriptor as the anchor does
// (rls.counting: each); STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT makes it
// each_stop_when_over; an overlay file may say otherwise.
func TestCounting(t *testing.T) {
	overlay := filepath.Join(t.TempDir(), "extauthz.yaml")
	if err := os.WriteFile(overlay, []byte("rls: {counting: all_or_nothing}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		env  []string
		want string
	}{
		{nil, config.CountingEach},
		{[]string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true"}, config.CountingEachStopWhenOver},
		{[]string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false"}, config.CountingEach},
		{[]string{OverlayVar + "=" + overlay}, config.CountingAllOrNothing},
	} {
		e, err := Read(lookupOf(append([]string{"USE_STATSD=false"}, c.env...)...))
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := e.Config()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.RLS.Counting != c.want {
			t.Errorf("%v: rls.counting = %q, want %q", c.env, cfg.RLS.Counting, c.want)
		}
	}
}
