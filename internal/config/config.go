// Package config loads and validates the sidecar's YAML configuration.
//
// Decoding is strict: an unknown field, a value of the wrong shape or an
// out-of-range setting is an error naming its field path, such as
// `policies[2].window: "1x" is not a duration`. Load returns a Config whose
// every field is checked and defaulted, ready to compile.
package config

import "time"

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
	Headers       Headers
	Fallback      Fallback
	Clients       Clients
	Plans         map[string]Plan
	Policies      []Policy
	// Warnings are accepted but inadvisable settings, such as plaintext keys.
	Warnings []string
}

// Listen holds the server addresses.
type Listen struct {
	GRPC       string // host:port or unix:///path
	Admin      string // host:port for /metrics, /healthz, /readyz; "" disables
	Reflection bool   // register gRPC server reflection
	// TLS serves gRPC over TLS (mTLS with ClientCAFile), for deployments
	// where Envoy does not reach the sidecar over loopback; nil: plaintext.
	TLS *ServerTLS
}

// ServerTLS is the gRPC listener's certificate and, for mTLS, the CAs that
// sign accepted client certificates.
type ServerTLS struct {
	CertFile     string
	KeyFile      string
	ClientCAFile string // "": clients are not asked for a certificate
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
	Addrs       []string // one: standalone; several: Redis Cluster
	Username    string
	PasswordEnv string        // name of the environment variable holding the password
	TLS         *ClientTLS    // nil: plaintext
	Timeout     time.Duration // per call
	KeyPrefix   string
	PoolSize    int // connections per Redis server (per Cluster master)
}

// Local holds the bounds of this process's per-key state.
type Local struct {
	MaxKeys   int
	SliceIdle time.Duration // hybrid: unspent tokens go back to Redis after this
}

// Headers holds response header options.
type Headers struct {
	Legacy bool // also send X-RateLimit-Limit/Remaining/Reset
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
	Burst  int64 // 0: Limit
}

// Policy is one rate limit and the requests it applies to.
type Policy struct {
	Name  string
	Match Match
	Key   []KeyPart // empty: one bucket shared by every matching request
	// UsePlan takes Limit, Window and Burst from the caller's plan; the
	// fields below are then zero.
	UsePlan      bool
	Limit        int64
	Window       time.Duration
	Burst        int64
	Algorithm    Algorithm
	Mode         Mode
	OnRedisError OnRedisError
	OnMissingKey OnMissingKey
	Shadow       bool
	// Queue and MaxDelay shape a leaky_bucket policy: at most Queue
	// requests wait for their slot (-1: as many as MaxDelay allows), none
	// longer than MaxDelay. Zero for other algorithms.
	Queue    int64
	MaxDelay time.Duration
}

// Match selects requests. Every non-empty field must match; a Match with no
// fields matches every request.
type Match struct {
	PathPrefix string
	Methods    []string // upper case
	Hosts      []string // lower case; "*.example.com" matches subdomains
	Context    map[string]string
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
