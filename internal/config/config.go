// Package config loads and validates the sidecar's YAML configuration.
//
// Decoding is strict: an unknown field, a value of the wrong shape or an
// out-of-range setting is an error naming its field path, such as
// `policies[2].window: "1x" is not a duration`. Load returns a Config whose
// every field is checked and defaulted, ready to compile.
package config

import (
	"net/netip"
	"time"
)

// Mode says where a policy's counts live.
type Mode string

// The modes.
const (
	ModeLocal  Mode = "local"
	ModeRedis  Mode = "redis"
	ModeHybrid Mode = "hybrid"
)

// Algorithm names how a policy counts.
type Algorithm string

// The algorithms, in the order the documentation lists them.
const (
	TokenBucket   Algorithm = "token_bucket"
	SlidingWindow Algorithm = "sliding_window"
	FixedWindow   Algorithm = "fixed_window"
	SlidingLog    Algorithm = "sliding_log"
	LeakyBucket   Algorithm = "leaky_bucket"
)

// Algorithms lists every algorithm.
var Algorithms = []Algorithm{TokenBucket, SlidingWindow, FixedWindow, SlidingLog, LeakyBucket}

// Charge says when a limit's takes may be refused.
type Charge string

// The choices of charge.
const (
	// ChargeRequest (the default) takes a request's units all or none: a
	// take past the limit is refused and counts nothing.
	ChargeRequest Charge = "request"
	// ChargeAlways counts every take of units in full, even past the
	// limit (into debt), and refuses none; a take of 0 units asks whether
	// at least one is left. For counts reported after the response, such
	// as a model's tokens, charged through the rate limit service.
	ChargeAlways Charge = "always"
)

// OnRedisError says what a Redis-backed policy does while Redis is unreachable.
type OnRedisError string

// The choices for on_redis_error.
const (
	OnErrorFallback OnRedisError = "fallback"
	OnErrorAllow    OnRedisError = "allow"
	OnErrorDeny     OnRedisError = "deny"
)

// OnMissingKey says what a policy does when a request lacks a part of its key.
type OnMissingKey string

// The choices for on_missing_key.
const (
	MissingAnonymous OnMissingKey = "anonymous"
	MissingReject    OnMissingKey = "reject"
)

// KeyKind is the source of one part of a partition key.
type KeyKind string

// The identity sources a key may be built from.
const (
	KeyClient    KeyKind = "client"
	KeyIP        KeyKind = "ip"
	KeyHeader    KeyKind = "header"
	KeyClaim     KeyKind = "claim"
	KeyPrincipal KeyKind = "principal"
	KeyPath      KeyKind = "path"
)

// Config is a validated configuration with every default applied.
type Config struct {
	Source        string   // the file it came from, or "embedded default"
	Digest        [32]byte // SHA-256 of the bytes it was parsed from
	Listen        Listen
	Redis         *Redis // nil when no redis section is given: local only
	DefaultMode   Mode
	Local         Local
	IPTrustedHops int
	// IPv4Prefix and IPv6Prefix are the leading bits of a client address
	// that the ip key part keeps: callers within one /IPv6Prefix network
	// (one subscriber's allocation: a /64 by default) share a bucket.
	IPv4Prefix int
	IPv6Prefix int
	Headers    Headers
	HTTP       HTTP
	Fallback   Fallback
	Clients    Clients
	Plans      map[string]Plan
	Policies   []Policy
	RLS        RLS
	RLQS       RLQS
	// Warnings are accepted but inadvisable settings, such as plaintext keys.
	Warnings []string
}

// Listen holds the server addresses.
type Listen struct {
	GRPC       string // host:port or unix:///path
	Admin      string // host:port for /metrics, /healthz, /readyz; "" disables
	Reflection bool   // register gRPC server reflection (on unless turned off: it shows only the public APIs served)
	// HTTP is the HTTP authorization endpoint for Envoy's http_service,
	// nginx auth_request and forward-auth proxies: host:port or
	// unix:///path; "" (the default) disables it.
	HTTP string
	// TLS serves gRPC over TLS (mTLS with ClientCAFile), for deployments
	// where Envoy does not reach the sidecar over loopback; nil: plaintext.
	TLS *ServerTLS
	// MaxConnections is the most connections the gRPC listener, and the
	// HTTP listener, each hold open at once (DefaultMaxConnections); one
	// past it is closed as soon as it is accepted, counted and logged
	// (internal/connlimit). The admin listener is not capped.
	MaxConnections int
}

// ServerTLS is the gRPC listener's certificate and, for mTLS, the CAs that
// sign accepted client certificates.
type ServerTLS struct {
	CertFile     string `yaml:"cert_file"`
	KeyFile      string `yaml:"key_file"`
	ClientCAFile string `yaml:"client_ca_file"` // "": clients are not asked for a certificate
	// ClientSAN, when set, is a name (DNS, URI or email SAN) a client
	// certificate must carry. No YAML key: envoyproxy/ratelimit's
	// GRPC_CLIENT_TLS_SAN sets it (internal/rlsenv).
	ClientSAN string `yaml:"-"`
}

// ClientTLS configures TLS to Redis.
type ClientTLS struct {
	CAFile             string // "": the system roots
	CertFile, KeyFile  string // a client certificate, when Redis asks for one
	ServerName         string // "": the host of the address
	InsecureSkipVerify bool   // for tests only; validate warns
}

// Redis holds the shared store's connection settings.
type Redis struct {
	Addrs []string // one: standalone; several: Redis Cluster; none with Sentinel
	// Sentinel finds the master through Redis Sentinel; nil: Addrs name
	// the servers.
	Sentinel    *Sentinel
	Username    string        // of the master and replicas (not the sentinels)
	PasswordEnv string        // name of the environment variable holding the password
	TLS         *ClientTLS    // nil: plaintext
	Timeout     time.Duration // per call
	KeyPrefix   string
	PoolSize    int // connections per Redis server (per Cluster master)
	// WaitReplicas, above zero, sends WAIT WaitReplicas WaitTimeout after
	// every hybrid token bucket lease call: a lease fewer replicas
	// acknowledge is not spent past the request that took it, so a
	// failover cannot lose it. Zero (the default): no WAIT.
	WaitReplicas int
	WaitTimeout  time.Duration
}

// Sentinel says which sentinels to ask for the master of a Redis
// replication group: the client follows the master they name across
// failovers.
type Sentinel struct {
	MasterName string   `yaml:"master_name"` // the name the sentinels monitor the master by
	Addrs      []string `yaml:"addrs"`       // the sentinels' host:port (one is enough; give them all)
	// Username and PasswordEnv authenticate to the sentinels, which may
	// have credentials of their own (Sentinel's requirepass); empty: none.
	Username    string `yaml:"username"`
	PasswordEnv string `yaml:"password_env"`
}

// Local holds the bounds of this process's per-key state.
type Local struct {
	MaxKeys   int
	SliceIdle time.Duration // hybrid: unspent tokens go back to Redis after this
	// LeaseTTL is how long a hybrid lease may be spent: Redis counts its
	// tokens as out until then, so no lease life lets the replicas admit
	// more than one bucket would (quota/redisstore/scripts/bucket_state.lua).
	LeaseTTL time.Duration
	// MaxLogBytes bounds what any one sliding_log policy's logs may take
	// in this process at worst (SlidingLogBytes); a policy that could take
	// more is refused.
	MaxLogBytes int64
}

// RLS configures Envoy's rate limit service (envoy.service.ratelimit.v3),
// served beside Check on the gRPC listener.
type RLS struct {
	// Domains are the files and directories holding envoyproxy/ratelimit
	// descriptor configurations (internal/rlsconfig reads them), resolved
	// against the directory of the configuration file; a directory
	// contributes its *.yaml and *.yml files.
	Domains []string
	// ResponseHeaders sends RateLimit-Policy and RateLimit (and, with
	// headers.legacy, X-RateLimit-*) in every answer.
	ResponseHeaders bool
	// OnUndecodable answers a RateLimitRequest that does not decode:
	// UndecodableDeny (OVER_LIMIT, the default) or UndecodableAllow (OK).
	// Either way it is a decision, never gRPC's Internal error, which
	// Envoy's ratelimit filter lets through (failure_mode_deny is off by
	// default) without counting it anywhere.
	OnUndecodable string
	// ShadowMode and QuotaMode are envoyproxy/ratelimit's SHADOW_MODE and
	// QUOTA_MODE for every descriptor: every limit decides and counts,
	// and the overall code is always OK; in quota mode the limits over
	// are listed in the dynamic metadata (DynamicMetadata) and their
	// statuses are OK.
	ShadowMode, QuotaMode bool
	// DynamicMetadata puts envoyproxy/ratelimit's dynamic metadata in
	// every answer (RESPONSE_DYNAMIC_METADATA): the domain, the
	// descriptors, and the quota-mode violations.
	DynamicMetadata bool
	// LimitHeaders, when set, adds envoyproxy/ratelimit's three headers
	// (LIMIT_RESPONSE_HEADERS_ENABLED) to every answer with a limit.
	LimitHeaders *LimitHeaders
	// Counting is how a request's descriptors are counted:
	// CountingAllOrNothing (the default), CountingEach (envoyproxy/
	// ratelimit's: every descriptor counts, the one over its limit
	// included, nothing refunded) or CountingEachStopWhenOver (the
	// anchor's under STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT). The
	// anchor's environment (internal/rlsenv) sets CountingEach.
	Counting string
}

// The choices of rls.counting.
const (
	CountingAllOrNothing     = "all_or_nothing"
	CountingEach             = "each"
	CountingEachStopWhenOver = "each_stop_when_over"
)

// LimitHeaders names envoyproxy/ratelimit's response headers.
type LimitHeaders struct {
	// By default RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset.
	Limit     string `yaml:"limit"`
	Remaining string `yaml:"remaining"`
	Reset     string `yaml:"reset"`
}

// The answers rls.on_undecodable takes.
const (
	UndecodableDeny  = "deny"
	UndecodableAllow = "allow"
)

// Headers holds response header options.
type Headers struct {
	Legacy bool `yaml:"legacy"` // also send X-RateLimit-Limit/Remaining/Reset
}

// HTTP holds what the HTTP door reads of an nginx auth_request
// subrequest: nginx always sends it as GET to the URI its configuration
// names, so the original method and URI travel in headers the
// configuration sets. Names are lower case.
type HTTP struct {
	URIHeader    string `yaml:"uri_header"`    // the original request URI (or an absolute URL)
	MethodHeader string `yaml:"method_header"` // the original request method
}

// Fallback holds the settings of local fallback while Redis is down.
type Fallback struct {
	PeerTTL  time.Duration
	MinPeers int
}

// Clients holds the known API keys and how they are presented.
type Clients struct {
	Header string // lower-case header name carrying the key
	Bearer bool   // also accept "authorization: Bearer <key>"
	Strip  bool   // remove the credential before the upstream sees it
	Keys   []Client
	// AuthFailures limits the unknown API keys one client address (the ip
	// key part's address or network) may present, as a token bucket
	// counted in this process; nil: no limit.
	AuthFailures *Plan
}

// Client is one known API key holder.
type Client struct {
	ID        string
	Digest    [32]byte // SHA-256 of the key
	Plan      string   // "" when none
	Plaintext bool     // the key was given in the clear
}

// Plan is a per-client limit used by policies with `limit: plan`.
type Plan struct {
	Limit  int64
	Window time.Duration
	// Period is the calendar window the plan's window names (1d, 1w, 1mo,
	// 1y), for policies with calendar: true; "" for a duration.
	Period Period
	Burst  int64 // 0: Limit
	// Unlimited plans never deny and keep no count; Limit, Window and
	// Burst are then zero.
	Unlimited bool
}

// Policy is one rate limit and the requests it applies to.
type Policy struct {
	Name  string
	Match Match
	Key   []KeyPart // empty: one bucket shared by every matching request
	// UsePlan takes Limit, Window and Burst from the caller's plan; the
	// fields below are then zero.
	UsePlan bool
	// PlanFrom names the plan with a verified claim or a header a trusted
	// filter sets (Kind KeyClaim or KeyHeader), before the API key's
	// plan; zero: the API key's plan. A name not under plans is
	// plans.default's.
	PlanFrom KeyPart
	// LimitFrom reads the limit from each request (From is CostConstant
	// when it does not); Limit is then LimitFrom.Default.
	LimitFrom    LimitSource
	Limit        int64
	Window       time.Duration
	Burst        int64
	Algorithm    Algorithm
	Mode         Mode
	OnRedisError OnRedisError
	// Charge: always makes the policy's takes never refused (see
	// ChargeAlways); its Check asks with 0 units, and the rate limit
	// service charges it after the response. ChargeRequest otherwise.
	Charge Charge
	// BlockFor is the penalty box: after a denial, the key is denied for
	// this long on every replica (quota.Limit.BlockFor). Zero: none.
	BlockFor     time.Duration
	OnMissingKey OnMissingKey
	Shadow       bool
	// Calendar aligns the windows to the calendar of TimeZone: Period
	// names the window (Window is its nominal length) and Algorithm is
	// fixed_window.
	Calendar bool
	Period   Period
	TimeZone *time.Location // UTC unless time_zone is given
	// Unlimited policies never deny and keep no count: their decisions are
	// counted in metrics only (for trusted networks and clients).
	Unlimited bool
	// Cost is what one request spends: 1 unless configured.
	Cost Cost
	// Queue and MaxDelay shape a leaky_bucket policy: at most Queue
	// requests wait for their slot (-1: as many as MaxDelay allows), none
	// longer than MaxDelay. Zero for other algorithms.
	Queue    int64
	MaxDelay time.Duration
}

// Match selects requests. Every non-empty field must match; a Match with no
// fields matches every request.
type Match struct {
	PathPrefix  string
	Methods     []string // upper case
	Hosts       []string // normalised (NormalizeHost); "*.example.com" matches subdomains
	Context     map[string]string
	Headers     []ValueMatch   // every one holds for the request's headers
	Claims      []ValueMatch   // every one holds for the verified JWT claims
	SourceCIDRs []netip.Prefix // the client address is in one of them (see ip_trusted_hops)
	// Not, when set, must not match: `not: {source_cidrs: [10.0.0.0/8]}`
	// excludes the internal network.
	Not *Match
}

// KeyPart is one component of a partition key.
type KeyPart struct {
	Kind KeyKind
	Name string // header name (lower case) or claim name; "" otherwise
}

func (k KeyPart) String() string {
	if k.Name == "" {
		return string(k.Kind)
	}
	return string(k.Kind) + ":" + k.Name
}

// DefaultPlan is the plan used by `limit: plan` policies for callers without
// a plan of their own (anonymous callers, keys with no plan).
const DefaultPlan = "default"
