// Package rlsenv reads envoyproxy/ratelimit's environment, so that the
// sidecar runs where that service runs with only the image changed: Envoy
// Gateway's rate-limit Deployment starts /bin/ratelimit with no arguments
// and configures it with these variables alone.
//
// Read takes every variable of the anchor's src/settings/settings.go that
// applies, with the anchor's defaults. Each is honoured (mapped onto the
// sidecar's configuration: listeners, TLS, Redis, the rate limit
// service's response options, where descriptors come from), accepted
// with no effect where the anchor's setting tunes a mechanism extauthz
// does not have (the explanation says so), or refused: a variable set to
// something extauthz cannot do (a memcached backend, statsd, a second
// Redis for per-second limits) is an error naming it, so a deployment
// never runs with a setting silently dropped. Variables the anchor does
// not know are ignored, as it ignores them.
//
// One variable is extauthz's own: EXTAUTHZ_OVERLAY names an extauthz
// configuration file laid over what the environment says (its mode,
// on_redis_error, fallback, local bounds, policies), which is how hybrid
// mode is one line in an EnvoyGateway patch.
package rlsenv

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Lookup reads one variable, as os.LookupEnv does.
type Lookup func(name string) (string, bool)

// Binary is the name Envoy Gateway starts the rate limit service by
// (/bin/ratelimit): run under it, the sidecar reads this environment.
const Binary = "ratelimit"

// ConfigTypeVar selects where descriptors come from; whenever it is set,
// the sidecar reads this environment.
const ConfigTypeVar = "CONFIG_TYPE"

// OverlayVar names an extauthz configuration file merged with the
// environment.
const OverlayVar = "EXTAUTHZ_OVERLAY"

// Config types.
const (
	ConfigFile = "FILE"
	ConfigXDS  = "GRPC_XDS_SOTW"
)

// Active reports whether a process started as argv0 in this environment
// reads it: started as ratelimit, or with CONFIG_TYPE set.
func Active(argv0 string, lookup Lookup) bool {
	if filepath.Base(argv0) == Binary {
		return true
	}
	_, ok := lookup(ConfigTypeVar)
	return ok
}

// Env is the environment, read and checked.
type Env struct {
	// Listeners: HOST:PORT serves /healthcheck (and the admin
	// endpoints); GRPC_HOST:GRPC_PORT, or GRPC_UDS, the rate limit
	// service (and Check).
	HTTPAddr, GRPCAddr string
	// MaxConnectionAge and MaxConnectionAgeGrace bound a gRPC
	// connection's life (GRPC_MAX_CONNECTION_AGE[_GRACE]).
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration
	// ServerTLS is the gRPC listener's TLS (GRPC_SERVER_USE_TLS); nil:
	// plaintext.
	ServerTLS *ServerTLS

	LogLevel  slog.Level
	LogFormat string // text or json

	ConfigType string // FILE or GRPC_XDS_SOTW
	// RuntimeDir holds the descriptor files with CONFIG_TYPE=FILE:
	// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY.
	RuntimeDir string
	// ForceStart serves before the first configuration arrives over xDS
	// (FORCE_START_WITHOUT_INITIAL_CONFIG), answering with no limits.
	ForceStart bool
	// HealthyWithConfig reports unhealthy until a configuration with a
	// domain is loaded (HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED).
	HealthyWithConfig bool
	XDS               XDS

	// Redis is the shared store; nil when REDIS_URL is not set (the
	// counts are then this process's own).
	Redis *Redis

	// The rate limit service's answers.
	ShadowMode, QuotaMode, DynamicMetadata bool
	LimitHeaders                           *LimitHeaders // nil: off
	// StopIncrementWhenOver is STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT:
	// rls.counting each_stop_when_over in place of each.
	StopIncrementWhenOver bool

	Prometheus *Prometheus // nil: USE_PROMETHEUS is off
	Tracing    *Tracing    // nil: TRACING_ENABLED is off

	// Overlay is the extauthz configuration file laid over the
	// environment ("": none).
	Overlay string

	// Vars are the variables read, in the order Explain gives them.
	Vars []Var
}

// ServerTLS is the gRPC listener's certificate and, when a CA is given,
// the CA client certificates must be signed by (and the SAN they must
// carry, when given).
type ServerTLS struct {
	CertFile, KeyFile, ClientCAFile, ClientSAN string
}

// XDS is the configuration server the descriptors come from with
// CONFIG_TYPE=GRPC_XDS_SOTW.
type XDS struct {
	ServerURL    string
	NodeID       string
	NodeMetadata map[string]string
	// Headers are added to the stream's metadata
	// (CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS).
	Headers map[string]string
	// TLS: nil for plaintext; else the client certificate, the CA that
	// signs the server's, and the name it must carry ("": the host).
	TLS *ClientTLS
	// Reconnection: the first wait, the longest, the growth factor
	// (XDS_CLIENT_BACKOFF_RANDOM_FACTOR, as the anchor uses it) and
	// whether waits are jittered.
	BackoffInitial, BackoffMax time.Duration
	BackoffFactor              float64
	BackoffJitter              bool
	// DialTimeout bounds one connection attempt
	// (CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL).
	DialTimeout time.Duration
	MaxMsgSize  int // 0: gRPC's default
}

// ClientTLS is a TLS client's files.
type ClientTLS struct {
	CertFile, KeyFile, CAFile, ServerName string
	SkipVerify                            bool
}

// Redis is the store the anchor's REDIS_* variables describe.
type Redis struct {
	Addrs      []string // one: standalone; several: a Cluster's seeds
	MasterName string   // Sentinel: the master's name; Addrs are the sentinels
	// AuthVar names the variable holding the password (REDIS_AUTH, or
	// the variable Read moved a user:password's password into), User
	// the user ("": none).
	User, AuthVar         string
	SentinelAuthVar       string
	TLS                   *ClientTLS
	Timeout               time.Duration
	PoolSize              int
	KeyPrefix             string
	sentinelUser, rawAuth string
}

// LimitHeaders names the anchor's response headers.
type LimitHeaders struct{ Limit, Remaining, Reset string }

// Prometheus is where the anchor's metrics are served.
type Prometheus struct {
	Addr, Path, MapperYAML string
	NearLimitRatio         float64
}

// Tracing is the anchor's tracing settings.
type Tracing struct {
	ServiceName, ServiceNamespace, InstanceID string
	Protocol                                  string // http or grpc
	SamplingRate                              float64
	Endpoint                                  string
}

// Var is one variable as read: its value (or the anchor's default, with
// Set false), and what the sidecar does with it.
type Var struct {
	Name, Value string
	Set         bool
	Meaning     string
}

// errorList gathers the problems of a read, each naming its variable.
type errorList []error

func (l *errorList) add(name, format string, args ...any) {
	*l = append(*l, fmt.Errorf("%s: %s", name, fmt.Sprintf(format, args...)))
}

// reader reads variables with their defaults and records them.
type reader struct {
	lookup Lookup
	env    *Env
	errs   errorList
}

// get returns a variable's value, or def when it is not set.
func (r *reader) get(name, def string) (string, bool) {
	v, ok := r.lookup(name)
	if !ok {
		return def, false
	}
	return v, true
}

// note records what a variable means; secret values are not shown.
func (r *reader) note(name, value string, set bool, meaning string) {
	r.env.Vars = append(r.env.Vars, Var{Name: name, Value: value, Set: set, Meaning: meaning})
}

func (r *reader) str(name, def, meaning string) string {
	v, set := r.get(name, def)
	r.note(name, v, set, meaning)
	return v
}

func (r *reader) boolean(name string, def bool, meaning string) bool {
	v, set := r.get(name, strconv.FormatBool(def))
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.errs.add(name, "%q is not true or false", v)
	}
	r.note(name, v, set, meaning)
	return b
}

func (r *reader) integer(name string, def int, meaning string) int {
	v, set := r.get(name, strconv.Itoa(def))
	n, err := strconv.Atoi(v)
	if err != nil {
		r.errs.add(name, "%q is not a whole number", v)
	}
	r.note(name, v, set, meaning)
	return n
}

func (r *reader) duration(name, def, meaning string) time.Duration {
	v, set := r.get(name, def)
	d, err := time.ParseDuration(v)
	if err != nil {
		r.errs.add(name, "%q is not a duration (like 10s, 1m)", v)
	}
	r.note(name, v, set, meaning)
	return d
}

func (r *reader) float(name, def, meaning string) float64 {
	v, set := r.get(name, def)
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		r.errs.add(name, "%q is not a number", v)
	}
	r.note(name, v, set, meaning)
	return f
}

// pairs reads a map as the anchor's settings library writes one:
// key:value,key:value.
func (r *reader) pairs(name, meaning string) map[string]string {
	v, set := r.get(name, "")
	r.note(name, v, set, meaning)
	if v == "" {
		return nil
	}
	m := map[string]string{}
	for _, kv := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(kv, ":")
		if !ok {
			r.errs.add(name, "%q is not key:value", kv)
			continue
		}
		m[strings.TrimSpace(k)] = strings.TrimSpace(val)
	}
	return m
}

// refuse makes a set variable an error: extauthz cannot honour it.
func (r *reader) refuse(name, why string) {
	if v, set := r.lookup(name); set {
		r.errs.add(name, "is set (%q), but %s", v, why)
	}
}

// Read reads the environment. The error lists every problem, each
// naming its variable.
func Read(lookup Lookup) (*Env, error) {
	r := &reader{lookup: lookup, env: &Env{}}
	r.listeners()
	r.logging()
	r.configSource()
	r.redis()
	r.answers()
	r.telemetry()
	r.unsupported()
	r.env.Overlay = r.str(OverlayVar, "", "an extauthz configuration file laid over this environment (mode, on_redis_error, fallback, policies)")
	if len(r.errs) > 0 {
		return nil, errors.Join(r.errs...)
	}
	return r.env, nil
}

func (r *reader) listeners() {
	e := r.env
	host := r.str("HOST", "0.0.0.0", "the HTTP listener's host: /healthcheck, and extauthz's /healthz, /readyz, /metrics")
	port := r.integer("PORT", 8080, "the HTTP listener's port")
	e.HTTPAddr = joinHostPort(host, port)
	gh := r.str("GRPC_HOST", "0.0.0.0", "the gRPC listener's host: the rate limit service, Check and grpc.health.v1")
	gp := r.integer("GRPC_PORT", 8081, "the gRPC listener's port")
	e.GRPCAddr = joinHostPort(gh, gp)
	if uds := r.str("GRPC_UDS", "", "a unix socket for the gRPC listener, in place of GRPC_HOST:GRPC_PORT"); uds != "" {
		e.GRPCAddr = "unix://" + uds
	}
	e.MaxConnectionAge = r.duration("GRPC_MAX_CONNECTION_AGE", "24h", "a gRPC connection is sent GOAWAY after this long (±10% jitter)")
	e.MaxConnectionAgeGrace = r.duration("GRPC_MAX_CONNECTION_AGE_GRACE", "1h", "then closed after this much more")
	useTLS := r.boolean("GRPC_SERVER_USE_TLS", false, "serve gRPC over TLS")
	cert := r.str("GRPC_SERVER_TLS_CERT", "", "the gRPC server's certificate chain (reloaded when the file changes)")
	key := r.str("GRPC_SERVER_TLS_KEY", "", "its private key")
	ca := r.str("GRPC_SERVER_TLS_CA_CERT", "", "the CA of client certificates: set, a client must present one it signed (Envoy Gateway's name)")
	clientCA := r.str("GRPC_CLIENT_TLS_CACERT", "", "the same, under the anchor's name")
	san := r.str("GRPC_CLIENT_TLS_SAN", "", "a SAN the client certificate must carry")
	if !useTLS {
		return
	}
	if cert == "" || key == "" {
		r.errs.add("GRPC_SERVER_USE_TLS", "is true, which needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY")
	}
	switch {
	case ca != "" && clientCA != "" && ca != clientCA:
		r.errs.add("GRPC_CLIENT_TLS_CACERT", "%q differs from GRPC_SERVER_TLS_CA_CERT %q; give one", clientCA, ca)
	case ca == "":
		ca = clientCA
	}
	if san != "" && ca == "" {
		r.errs.add("GRPC_CLIENT_TLS_SAN", "needs a client CA (GRPC_SERVER_TLS_CA_CERT or GRPC_CLIENT_TLS_CACERT): without one no client certificate is asked for")
	}
	e.ServerTLS = &ServerTLS{CertFile: cert, KeyFile: key, ClientCAFile: ca, ClientSAN: san}
}

func joinHostPort(host string, port int) string {
	return net.JoinHostPort(host, strconv.Itoa(port))
}

// logLevels are the anchor's (logrus's) levels and ours for each.
var logLevels = map[string]slog.Level{
	"trace": slog.LevelDebug, "debug": slog.LevelDebug, "info": slog.LevelInfo,
	"warn": slog.LevelWarn, "warning": slog.LevelWarn,
	"error": slog.LevelError, "fatal": slog.LevelError, "panic": slog.LevelError,
}

func (r *reader) logging() {
	lv := r.str("LOG_LEVEL", "WARN", "the log level: trace and debug are debug; fatal and panic are error")
	l, ok := logLevels[strings.ToLower(lv)]
	if !ok {
		r.errs.add("LOG_LEVEL", "%q is not a level; choices are trace, debug, info, warn, error, fatal, panic", lv)
	}
	r.env.LogLevel = l
	f := r.str("LOG_FORMAT", "text", "text or json")
	switch strings.ToLower(f) {
	case "json":
		r.env.LogFormat = "json"
	default: // the anchor logs text for any other value
		r.env.LogFormat = "text"
	}
}

func (r *reader) configSource() {
	e := r.env
	e.ConfigType = r.str(ConfigTypeVar, ConfigFile, "where descriptors come from: FILE (RUNTIME_*) or GRPC_XDS_SOTW (CONFIG_GRPC_XDS_*)")
	switch e.ConfigType {
	case ConfigFile, ConfigXDS:
	default:
		r.errs.add(ConfigTypeVar, "%q is not a configuration type; choices are %s, %s", e.ConfigType, ConfigFile, ConfigXDS)
	}
	root := r.str("RUNTIME_ROOT", "/srv/runtime_data/current", "with FILE: the root of the descriptor files")
	sub := r.str("RUNTIME_SUBDIRECTORY", "", "with FILE: under the root")
	app := r.str("RUNTIME_APPDIRECTORY", "config", "with FILE: under that, the directory of *.yaml descriptor files")
	e.RuntimeDir = filepath.Join(root, sub, app)
	r.boolean("RUNTIME_IGNOREDOTFILES", false, "accepted: hidden files are always left out (a ConfigMap's ..data)")
	r.boolean("RUNTIME_WATCH_ROOT", true, "accepted: the directory is always watched, symlink swaps included")
	e.ForceStart = r.boolean("FORCE_START_WITHOUT_INITIAL_CONFIG", false, "with GRPC_XDS_SOTW: serve before the first configuration arrives, with no limits")
	e.HealthyWithConfig = r.boolean("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false, "/healthcheck and grpc.health.v1 fail until a configuration with a domain is loaded")
	x := &e.XDS
	x.ServerURL = r.str("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000", "with GRPC_XDS_SOTW: the xDS server, host:port")
	x.NodeID = r.str("CONFIG_GRPC_XDS_NODE_ID", "default", "the node id the server keys its snapshot by")
	meta := r.str("CONFIG_GRPC_XDS_NODE_METADATA", "", "node metadata, key=value,key=value")
	for _, kv := range strings.Split(meta, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			if x.NodeMetadata == nil {
				x.NodeMetadata = map[string]string{}
			}
			x.NodeMetadata[k] = v
		}
	}
	x.Headers = r.pairs("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "gRPC metadata sent on the xDS stream, key:value,key:value")
	useTLS := r.boolean("CONFIG_GRPC_XDS_SERVER_USE_TLS", false, "connect to the xDS server over TLS (1.3)")
	cert := r.str("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "", "the client certificate shown to the xDS server (reloaded when the file changes)")
	key := r.str("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "", "its private key")
	ca := r.str("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "", "the CA of the xDS server's certificate (reloaded when the file changes)")
	san := r.str("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "", "the name the xDS server's certificate must carry (default: the URL's host)")
	if useTLS {
		x.TLS = &ClientTLS{CertFile: cert, KeyFile: key, CAFile: ca, ServerName: san}
		if (cert == "") != (key == "") {
			r.errs.add("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "and CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together")
		}
	}
	x.DialTimeout = r.duration("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3s", "how long one connection attempt may take")
	x.BackoffInitial = r.duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10s", "the first wait before reconnecting to the xDS server")
	x.BackoffMax = r.duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "60s", "the longest wait")
	x.BackoffFactor = r.float("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0.5", "each wait grows by this factor (at least 1)")
	x.BackoffJitter = r.boolean("XDS_CLIENT_BACKOFF_JITTER", true, "waits are jittered")
	if x.BackoffInitial <= 0 || x.BackoffMax < x.BackoffInitial {
		r.errs.add("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "%s must be at least XDS_CLIENT_BACKOFF_INITIAL_INTERVAL %s, which must be positive", x.BackoffMax, x.BackoffInitial)
	}
	x.MaxMsgSize = r.integer("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", 0, "the largest xDS message accepted (0: gRPC's 4 MiB)")
}

func (r *reader) redis() {
	url, urlSet := r.get("REDIS_URL", "")
	socket := r.str("REDIS_SOCKET_TYPE", "unix", "tcp; a unix socket is not supported")
	typ := r.str("REDIS_TYPE", "SINGLE", "single, cluster or sentinel")
	pool := r.integer("REDIS_POOL_SIZE", 10, "connections per Redis server")
	auth, authSet := r.get("REDIS_AUTH", "")
	r.note("REDIS_AUTH", mask(auth), authSet, "the password, or user:password")
	sauth, sauthSet := r.get("REDIS_SENTINEL_AUTH", "")
	r.note("REDIS_SENTINEL_AUTH", mask(sauth), sauthSet, "the sentinels' password, or user:password")
	useTLS := r.boolean("REDIS_TLS", false, "connect to Redis over TLS")
	cert := r.str("REDIS_TLS_CLIENT_CERT", "", "a client certificate for Redis")
	key := r.str("REDIS_TLS_CLIENT_KEY", "", "its private key")
	ca := r.str("REDIS_TLS_CACERT", "", "the CA of Redis's certificate (default: the system's)")
	skip := r.boolean("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false, "do not check Redis's certificate (tests only)")
	timeout := r.duration("REDIS_TIMEOUT", "10s", "accepted; each call's timeout is extauthz's (redis.timeout in EXTAUTHZ_OVERLAY), which holds exactness under load")
	prefix := r.str("CACHE_KEY_PREFIX", "", "a prefix to every Redis key")
	r.str("REDIS_PIPELINE_WINDOW", "0", "accepted: extauthz pipelines every call on its own")
	r.str("REDIS_PIPELINE_LIMIT", "0", "accepted: extauthz pipelines every call on its own")
	if v := r.str("REDIS_POOL_ON_EMPTY_BEHAVIOR", "WAIT", "WAIT: a call waits for a free connection (the only behaviour)"); !strings.EqualFold(v, "WAIT") {
		r.errs.add("REDIS_POOL_ON_EMPTY_BEHAVIOR", "%q: extauthz only waits for a free connection (WAIT)", v)
	}
	r.note("REDIS_URL", url, urlSet, "the Redis server(s): host:port; several, comma-separated, for a Cluster; for sentinel, master name then the sentinels")
	if !urlSet {
		return
	}
	if !strings.EqualFold(socket, "tcp") {
		r.errs.add("REDIS_SOCKET_TYPE", "%q: extauthz connects to Redis over tcp only; set REDIS_SOCKET_TYPE=tcp", socket)
	}
	rd := &Redis{PoolSize: pool, KeyPrefix: prefix, Timeout: timeout}
	urls := strings.Split(url, ",")
	switch strings.ToLower(typ) {
	case "single":
		if len(urls) != 1 {
			r.errs.add("REDIS_URL", "names %d servers; with REDIS_TYPE=single give one", len(urls))
		}
		rd.Addrs = urls
	case "cluster":
		if len(urls) < 2 {
			r.errs.add("REDIS_TYPE", "cluster with one address in REDIS_URL: extauthz finds a Cluster from two seed addresses or more; list them, comma-separated")
		}
		rd.Addrs = urls
	case "sentinel":
		if len(urls) < 2 {
			r.errs.add("REDIS_URL", "with REDIS_TYPE=sentinel is the master's name and the sentinels: name,host:port,...")
		} else {
			rd.MasterName, rd.Addrs = urls[0], urls[1:]
		}
	default:
		r.errs.add("REDIS_TYPE", "%q is not a type; choices are single, cluster, sentinel", typ)
	}
	for _, a := range rd.Addrs {
		if !strings.Contains(a, ":") {
			r.errs.add("REDIS_URL", "%q is not host:port", a)
		}
	}
	if authSet && auth != "" {
		rd.rawAuth = auth
		rd.AuthVar = "REDIS_AUTH"
		if user, _, ok := strings.Cut(auth, ":"); ok {
			rd.User, rd.AuthVar = user, redisPasswordVar
		}
	}
	if sauthSet && sauth != "" {
		rd.SentinelAuthVar = "REDIS_SENTINEL_AUTH"
		if user, _, ok := strings.Cut(sauth, ":"); ok {
			rd.sentinelUser, rd.SentinelAuthVar = user, sentinelPasswordVar
		}
	}
	if useTLS {
		rd.TLS = &ClientTLS{CertFile: cert, KeyFile: key, CAFile: ca, SkipVerify: skip}
	}
	r.env.Redis = rd
}

// The variables Apply moves the password of a user:password into, so
// that the configuration names a variable holding the password alone.
const (
	redisPasswordVar    = "EXTAUTHZ_RLSENV_REDIS_PASSWORD"
	sentinelPasswordVar = "EXTAUTHZ_RLSENV_SENTINEL_PASSWORD"
)

func mask(v string) string {
	if v == "" {
		return ""
	}
	return "(set, not shown)"
}

func (r *reader) answers() {
	e := r.env
	e.ShadowMode = r.boolean("SHADOW_MODE", false, "every limit decides and counts, the answer is always OK")
	e.QuotaMode = r.boolean("QUOTA_MODE", false, "every limit is a quota: over it, the answer is OK and the dynamic metadata lists it")
	e.DynamicMetadata = r.boolean("RESPONSE_DYNAMIC_METADATA", false, "answers carry the anchor's dynamic metadata")
	on := r.boolean("LIMIT_RESPONSE_HEADERS_ENABLED", false, "answers carry the limit, remaining and reset headers")
	lh := &LimitHeaders{
		Limit:     r.str("LIMIT_LIMIT_HEADER", "RateLimit-Limit", "the limit header's name"),
		Remaining: r.str("LIMIT_REMAINING_HEADER", "RateLimit-Remaining", "the remaining header's name"),
		Reset:     r.str("LIMIT_RESET_HEADER", "RateLimit-Reset", "the reset header's name"),
	}
	if on {
		e.LimitHeaders = lh
	}
	e.StopIncrementWhenOver = r.boolean("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", false,
		"when a descriptor is over its limit, only the descriptors over count (rls.counting: each_stop_when_over; else each)")
	r.integer("LOCAL_CACHE_SIZE_IN_BYTES", 0, "accepted: extauthz bounds its own tables (local.max_keys in EXTAUTHZ_OVERLAY)")
	r.integer("EXPIRATION_JITTER_MAX_SECONDS", 300, "accepted: extauthz's keys expire with their window")
}

func (r *reader) telemetry() {
	e := r.env
	statsd := r.boolean("USE_STATSD", true, "statsd is not supported; unset, it is off (extauthz serves Prometheus)")
	if v, set := r.lookup("USE_STATSD"); set && statsd {
		r.errs.add("USE_STATSD", "is %q, but extauthz does not send statsd; set it to false and use USE_PROMETHEUS", v)
	}
	r.str("STATSD_HOST", "localhost", "unused without statsd")
	r.integer("STATSD_PORT", 8125, "unused without statsd")
	r.str("EXTRA_TAGS", "", "unused without statsd")
	r.str("STATS_FLUSH_INTERVAL", "10s", "unused: Prometheus is scraped")
	r.boolean("DISABLE_STATS", false, "accepted: extauthz's own metrics stay on the HTTP listener's /metrics")
	prom := r.boolean("USE_PROMETHEUS", false, "serve metrics for Prometheus on PROMETHEUS_ADDR: the anchor's stats under the names PROMETHEUS_MAPPER_YAML gives (ratelimit_service_rate_limit_total_hits, ...), and extauthz's own series")
	p := &Prometheus{
		Addr:       r.str("PROMETHEUS_ADDR", ":9090", "where the metrics are served"),
		Path:       r.str("PROMETHEUS_PATH", "/metrics", "their path"),
		MapperYAML: r.str("PROMETHEUS_MAPPER_YAML", "", "a statsd_exporter mapping of the anchor's stat names to Prometheus names (empty: the anchor's default names); a file that does not load stops the start-up"),
	}
	p.NearLimitRatio = r.float("NEAR_LIMIT_RATIO", "0.8", "a hit past this share of its limit also counts as near_limit")
	if p.NearLimitRatio < 0 || p.NearLimitRatio > 1 {
		r.errs.add("NEAR_LIMIT_RATIO", "%v is not between 0 and 1", p.NearLimitRatio)
	}
	r.boolean("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", false, "accepted: the anchor's response-time histogram is not served (extauthz_check_duration_seconds{door=\"rls\"} is)")
	if prom {
		e.Prometheus = p
	}
	tr := &Tracing{}
	on := r.boolean("TRACING_ENABLED", false, "trace calls with OpenTelemetry (OTLP)")
	tr.ServiceName = r.str("TRACING_SERVICE_NAME", "RateLimit", "the traces' service.name")
	tr.ServiceNamespace = r.str("TRACING_SERVICE_NAMESPACE", "", "service.namespace")
	tr.InstanceID = r.str("TRACING_SERVICE_INSTANCE_ID", "", "service.instance.id")
	tr.Protocol = r.str("TRACING_EXPORTER_PROTOCOL", "http", "http or grpc")
	tr.SamplingRate = r.float("TRACING_SAMPLING_RATE", "1", "the share of traces kept, 0 to 1")
	tr.Endpoint = r.str("OTEL_EXPORTER_OTLP_ENDPOINT", "", "the OTLP collector")
	if on {
		if tr.Protocol != "http" && tr.Protocol != "grpc" {
			r.errs.add("TRACING_EXPORTER_PROTOCOL", "%q: choices are http, grpc", tr.Protocol)
		}
		if tr.SamplingRate < 0 || tr.SamplingRate > 1 {
			r.errs.add("TRACING_SAMPLING_RATE", "%v is not between 0 and 1", tr.SamplingRate)
		}
		e.Tracing = tr
	}
}

// unsupported refuses what extauthz cannot do when it is asked for.
func (r *reader) unsupported() {
	if v, set := r.lookup("BACKEND_TYPE"); set && !strings.EqualFold(v, "redis") {
		r.errs.add("BACKEND_TYPE", "%q: extauthz keeps counts in Redis (and in this process); memcached is not supported", v)
	}
	r.note("BACKEND_TYPE", "redis", false, "redis")
	for _, name := range []string{"MEMCACHE_HOST_PORT", "MEMCACHE_SRV"} {
		r.refuse(name, "memcached is not supported")
	}
	if v, set := r.lookup("USE_DOG_STATSD"); set && isTrue(v) {
		r.errs.add("USE_DOG_STATSD", "is %q, but extauthz does not send statsd", v)
	}
	if v, set := r.lookup("REDIS_PERSECOND"); set && isTrue(v) {
		r.errs.add("REDIS_PERSECOND", "is %q, but extauthz keeps every limit in one Redis (REDIS_URL); a second Redis for per-second limits is not supported", v)
	}
	if v, set := r.lookup("MERGE_DOMAIN_CONFIG"); set && isTrue(v) {
		r.errs.add("MERGE_DOMAIN_CONFIG", "is %q, but extauthz refuses two configurations of one domain; merge them into one", v)
	}
	if v, set := r.lookup("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION"); set && isTrue(v) {
		r.errs.add("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "is %q, but extauthz's health is never tied to Redis: without it, limits follow on_redis_error", v)
	}
	r.refuse("DEBUG_HOST", "extauthz serves no debug listener; serve -pprof puts pprof on the HTTP listener")
	r.refuse("DEBUG_PORT", "extauthz serves no debug listener; serve -pprof puts pprof on the HTTP listener")
}

func isTrue(v string) bool {
	b, err := strconv.ParseBool(v)
	return err != nil || b // a value that is not false asks for it
}
