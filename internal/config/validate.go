package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// DefaultPoolSize is redis.pool_size left out: connections per Redis
// server (per Cluster master) for decisions. Decisions are autopipelined
// onto one connection; the rest are spare (docs/capacity.md). maxPoolSize
// bounds it: more only spends Redis's maxclients.
const (
	DefaultPoolSize = 4
	maxPoolSize     = 256
	// DefaultWaitTimeout is redis.wait_timeout left out: how long a lease
	// call's WAIT waits for the replicas (redis.wait_replicas) to
	// acknowledge it; a replica that keeps up acknowledges within a round
	// trip. maxWaitReplicas bounds wait_replicas (Redis's replicas).
	DefaultWaitTimeout = 10 * time.Millisecond
	maxWaitReplicas    = 16
)

// DefaultMaxConnections is listen.max_connections: far above a sidecar's
// one Envoy (a connection per worker thread), and per replica of a shared
// Deployment, 256 Envoys of four workers. Each gRPC connection takes ~35
// KiB of heap before its first call (the transport's read and write
// buffers), so the cap bounds that at ~35 MiB
// (TestListenerConnectionCapDefault prints it).
const (
	DefaultMaxConnections = 1024
	maxMaxConnections     = 1_000_000
)

// Defaults for settings left out of the file.
const (
	DefaultGRPC       = "127.0.0.1:9001"
	DefaultAdmin      = "127.0.0.1:9090"
	DefaultTimeout    = 150 * time.Millisecond
	DefaultKeyPrefix  = "rl:"
	DefaultMaxKeys    = 100_000
	DefaultSliceIdle  = time.Second
	DefaultLeaseTTL   = 60 * time.Second
	maxLeaseTTL       = 10 * time.Minute
	DefaultPeerTTL    = 15 * time.Second
	DefaultMinPeers   = 2
	DefaultKeyHeader  = "x-api-key"
	minWindow         = time.Millisecond
	maxWindow         = 366 * 24 * time.Hour
	maxLimit          = 1 << 40
	maxTrustedHops    = 64
	maxPolicyKeyParts = 8
)

// The headers nginx's documented auth_request example sets, the defaults
// of http.uri_header and http.method_header.
const (
	DefaultURIHeader    = "x-original-uri"
	DefaultMethodHeader = "x-original-method"
)

// Defaults of the ip key part's address prefixes.
const (
	// DefaultIPv4Prefix keys an IPv4 caller by its address.
	DefaultIPv4Prefix = 32
	// DefaultIPv6Prefix keys an IPv6 caller by its /64: a single host or
	// subscriber is routinely given a whole /64 (RFC 6177, SLAAC), and
	// would otherwise have 2^64 fresh buckets to pick from.
	DefaultIPv6Prefix = 64
)

var (
	policyName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)
	// token is RFC 9110's header field name syntax.
	headerName = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
	hexDigest  = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
	httpMethod = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
	envName    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

func validate(r *rawConfig, errs *Errors) *Config {
	c := &Config{
		Listen: Listen{GRPC: DefaultGRPC, Admin: DefaultAdmin, Reflection: r.Listen.Reflection == nil || *r.Listen.Reflection},
		Local:  Local{MaxKeys: DefaultMaxKeys, SliceIdle: DefaultSliceIdle, LeaseTTL: DefaultLeaseTTL, MaxLogBytes: DefaultMaxLogBytes},
		Fallback: Fallback{
			PeerTTL:  DefaultPeerTTL,
			MinPeers: DefaultMinPeers,
		},
		Headers:       r.Headers,
		IPTrustedHops: r.IPTrustedHops,
		IPv4Prefix:    DefaultIPv4Prefix,
		IPv6Prefix:    DefaultIPv6Prefix,
		Plans:         map[string]Plan{},
	}

	if r.Listen.GRPC != nil {
		c.Listen.GRPC = *r.Listen.GRPC
	}
	if err := checkListen(c.Listen.GRPC, true); err != nil {
		errs.add("listen.grpc", "%q %s", c.Listen.GRPC, err)
	}
	if r.Listen.Admin != nil {
		c.Listen.Admin = *r.Listen.Admin
	}
	if c.Listen.Admin != "" {
		if err := checkListen(c.Listen.Admin, false); err != nil {
			errs.add("listen.admin", "%q %s", c.Listen.Admin, err)
		}
	}
	c.Listen.HTTP = r.Listen.HTTP
	if c.Listen.HTTP != "" {
		if err := checkListen(c.Listen.HTTP, true); err != nil {
			errs.add("listen.http", "%q %s", c.Listen.HTTP, err)
		}
	}
	c.Listen.MaxConnections = DefaultMaxConnections
	if n := r.Listen.MaxConnections; n != nil {
		c.Listen.MaxConnections = *n
		if *n < 1 || *n > maxMaxConnections {
			errs.add("listen.max_connections", "%d is out of range; give 1 to %d connections per listener", *n, maxMaxConnections)
		}
	}
	sameAddress(c.Listen, errs)
	c.HTTP = validateHTTP(r.HTTP, errs)
	if t := r.Listen.TLS; t != nil {
		c.Listen.TLS = &ServerTLS{CertFile: t.CertFile, KeyFile: t.KeyFile, ClientCAFile: t.ClientCAFile}
		requireFile(t.CertFile, "listen.tls.cert_file", errs)
		requireFile(t.KeyFile, "listen.tls.key_file", errs)
		optionalFile(t.ClientCAFile, "listen.tls.client_ca_file", errs)
	}

	if r.Redis != nil {
		c.Redis = validateRedis(r.Redis, errs, &c.Warnings)
	}

	c.DefaultMode = ModeLocal
	if c.Redis != nil {
		c.DefaultMode = ModeHybrid
	}
	if r.DefaultMode != "" {
		if m, ok := parseMode(r.DefaultMode); ok {
			c.DefaultMode = m
		} else {
			errs.add("default_mode", "%q is not a mode; choices are %s", r.DefaultMode, modeChoices)
		}
	}
	if c.DefaultMode != ModeLocal && c.Redis == nil {
		errs.add("default_mode", "%q needs a redis section", c.DefaultMode)
	}

	if r.Local.MaxKeys != 0 {
		c.Local.MaxKeys = r.Local.MaxKeys
	}
	if c.Local.MaxKeys < 1 {
		errs.add("local.max_keys", "%d must be at least 1", r.Local.MaxKeys)
	}
	durationField(r.Local.SliceIdle, "local.slice_idle", &c.Local.SliceIdle, errs)
	durationField(r.Local.LeaseTTL, "local.lease_ttl", &c.Local.LeaseTTL, errs)
	if c.Local.LeaseTTL > maxLeaseTTL {
		errs.add("local.lease_ttl", "%s is over %s: a replica that dies strands its leases' tokens until they end", c.Local.LeaseTTL, maxLeaseTTL)
	}
	if r.Local.MaxLogBytes != "" {
		if n, ok := parseBytes(r.Local.MaxLogBytes); ok && n > 0 {
			c.Local.MaxLogBytes = n
		} else {
			errs.add("local.max_log_bytes", "%q is not a positive size (bytes, or with KiB, MiB or GiB: 256MiB)", r.Local.MaxLogBytes)
		}
	}

	if c.IPTrustedHops < 0 || c.IPTrustedHops > maxTrustedHops {
		errs.add("ip_trusted_hops", "%d must be between 0 and %d", c.IPTrustedHops, maxTrustedHops)
	}
	prefixField(r.IPv4Prefix, "ipv4_prefix", 32, &c.IPv4Prefix, errs)
	prefixField(r.IPv6Prefix, "ipv6_prefix", 128, &c.IPv6Prefix, errs)

	durationField(r.Fallback.PeerTTL, "fallback.peer_ttl", &c.Fallback.PeerTTL, errs)
	if r.Fallback.MinPeers != 0 {
		c.Fallback.MinPeers = r.Fallback.MinPeers
	}
	if c.Fallback.MinPeers < 1 {
		errs.add("fallback.min_peers", "%d must be at least 1", r.Fallback.MinPeers)
	}

	for _, name := range sortedKeys(r.Plans) {
		c.Plans[name] = validatePlan(r.Plans[name], "plans."+name, errs)
	}
	c.Clients = validateClients(&r.Clients, c.Plans, errs, &c.Warnings)

	c.RLS = validateRLS(&r.RLS, errs)

	names := map[string]int{}
	for i := range r.Policies {
		path := fmt.Sprintf("policies[%d]", i)
		p := validatePolicy(&r.Policies[i], path, c, errs)
		if prev, dup := names[p.Name]; dup && p.Name != "" {
			errs.add(path+".name", "%q is already used by policies[%d]", p.Name, prev)
		}
		names[p.Name] = i
		c.Policies = append(c.Policies, p)
	}
	c.RLQS = validateRLQS(&r.RLQS, c, errs)
	return c
}

// prefixField sets *bits from an address prefix length given at path, of
// 1 to max bits; nil keeps the default.
func prefixField(v *int, path string, max int, bits *int, errs *Errors) {
	if v == nil {
		return
	}
	if *v < 1 || *v > max {
		errs.add(path, "%d must be between 1 and %d (bits of the address that identify a caller)", *v, max)
		return
	}
	*bits = *v
}

func checkListen(addr string, unixOK bool) error {
	if strings.HasPrefix(addr, "unix://") {
		if !unixOK {
			return fmt.Errorf("must be host:port")
		}
		if strings.TrimPrefix(addr, "unix://") == "" {
			return fmt.Errorf("needs a socket path after unix://")
		}
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("is not host:port")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("has an invalid port")
	}
	return nil
}

// sameAddress reports two listeners given one fixed address: the second
// would fail to bind at start-up, and this names the fields now.
func sameAddress(l Listen, errs *Errors) {
	seen := map[string]string{}
	for _, f := range []struct{ path, addr string }{{"listen.grpc", l.GRPC}, {"listen.http", l.HTTP}, {"listen.admin", l.Admin}} {
		if f.addr == "" || strings.HasSuffix(f.addr, ":0") {
			continue // off, or a port the kernel picks
		}
		if prev, dup := seen[f.addr]; dup {
			errs.add(f.path, "%q is also %s; each listener needs its own address", f.addr, prev)
		}
		seen[f.addr] = f.path
	}
}

func validateHTTP(r HTTP, errs *Errors) HTTP {
	h := HTTP{URIHeader: DefaultURIHeader, MethodHeader: DefaultMethodHeader}
	for _, f := range []struct {
		path, raw string
		dst       *string
	}{{"http.uri_header", r.URIHeader, &h.URIHeader}, {"http.method_header", r.MethodHeader, &h.MethodHeader}} {
		if f.raw == "" {
			continue
		}
		if !headerName.MatchString(f.raw) {
			errs.add(f.path, "%q is not a header name", f.raw)
			continue
		}
		*f.dst = strings.ToLower(f.raw)
	}
	if h.URIHeader == h.MethodHeader {
		errs.add("http.method_header", "%q is also http.uri_header; the method and the URI need a header each", h.MethodHeader)
	}
	return h
}

// burstField checks a burst: 0 (the default, the limit) or a capacity of
// at least one unit.
func burstField(b int64, path string, errs *Errors) {
	if b < 0 || b > maxLimit {
		errs.add(path, "%d must be between 0 (the limit) and %d", b, int64(maxLimit))
	}
}

// maxRefill bounds the time a token bucket takes to refill from empty,
// burst × (window / limit): as long as the longest window. A bucket's state
// is the instant it is full again, in nanoseconds; the bound keeps that
// instant, and every wait computed from it, far inside int64 (a burst of
// 200,000 at one a day once overflowed into a 37-year Retry-After).
const maxRefill = maxWindow

// refillField rejects a token bucket burst that would take longer than
// maxRefill to refill, at the interval the quota package computes
// (window / limit, at least 1ns). A burst of at most the limit refills
// within the window, so only a larger one is checked.
func refillField(limit int64, window time.Duration, burst int64, path string, errs *Errors) {
	if limit < 1 || window <= 0 || burst <= limit {
		return
	}
	iv := max(int64(window)/limit, 1)
	if most := int64(maxRefill) / iv; burst > most {
		errs.add(path, "%d tokens at one every %s take %.0f days to refill; at most %d at this rate (a bucket must refill within %d days, the longest window)",
			burst, time.Duration(iv), float64(burst)*float64(iv)/float64(24*time.Hour), most, maxRefill/(24*time.Hour))
	}
}

func validateRedis(r *rawRedis, errs *Errors, warnings *[]string) *Redis {
	rc := &Redis{
		Addrs:       r.Addrs,
		Username:    r.Username,
		PasswordEnv: r.PasswordEnv,
		Timeout:     DefaultTimeout,
		KeyPrefix:   DefaultKeyPrefix,
		PoolSize:    DefaultPoolSize,
	}
	switch {
	case r.Sentinel != nil && len(r.Addrs) > 0:
		errs.add("redis.sentinel", "excludes redis.addrs: with Sentinel the sentinels name the master; give either redis.addrs (a standalone server or Cluster) or redis.sentinel.addrs (the sentinels)")
	case r.Sentinel != nil:
		rc.Sentinel = validateSentinel(r.Sentinel, errs)
	case len(r.Addrs) == 0:
		errs.add("redis.addrs", "needs at least one host:port (or redis.sentinel, to find the master through Sentinel)")
	}
	hostPorts(r.Addrs, "redis.addrs", errs)
	if r.PasswordEnv != "" && !envName.MatchString(r.PasswordEnv) {
		errs.add("redis.password_env", "%q is not an environment variable name", r.PasswordEnv)
	}
	if t := r.TLS; t.Enabled {
		rc.TLS = &ClientTLS{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
		optionalFile(t.CAFile, "redis.tls.ca_file", errs)
		optionalFile(t.CertFile, "redis.tls.cert_file", errs)
		optionalFile(t.KeyFile, "redis.tls.key_file", errs)
		if (t.CertFile == "") != (t.KeyFile == "") {
			errs.add("redis.tls", "cert_file and key_file go together")
		}
		if t.InsecureSkipVerify {
			*warnings = append(*warnings, "redis.tls.insecure_skip_verify: the Redis server's certificate is not checked; for tests only")
		}
	}
	durationField(r.Timeout, "redis.timeout", &rc.Timeout, errs)
	if r.PoolSize != 0 {
		rc.PoolSize = r.PoolSize
	}
	if rc.PoolSize < 1 || rc.PoolSize > maxPoolSize {
		errs.add("redis.pool_size", "%d must be between 1 and %d", r.PoolSize, maxPoolSize)
	}
	validateWait(r, rc, errs)
	if r.KeyPrefix != nil {
		rc.KeyPrefix = *r.KeyPrefix
		if strings.ContainsAny(rc.KeyPrefix, "{}") {
			errs.add("redis.key_prefix", "%q must not contain braces: they delimit the hash tag", rc.KeyPrefix)
		}
	}
	return rc
}

// validateWait checks redis.wait_replicas and redis.wait_timeout: WAIT
// waits inside a lease call, so its timeout must leave the call time to
// answer, and is at least WAIT's own resolution (1ms; WAIT 0 would wait
// for ever).
func validateWait(r *rawRedis, rc *Redis, errs *Errors) {
	if r.WaitReplicas < 0 || r.WaitReplicas > maxWaitReplicas {
		errs.add("redis.wait_replicas", "%d must be between 0 (no WAIT) and %d", r.WaitReplicas, maxWaitReplicas)
		return
	}
	rc.WaitReplicas = r.WaitReplicas
	if r.WaitReplicas == 0 {
		if r.WaitTimeout != "" {
			errs.add("redis.wait_timeout", "is set but redis.wait_replicas is 0: no WAIT is sent; set wait_replicas or drop wait_timeout")
		}
		return
	}
	rc.WaitTimeout = DefaultWaitTimeout
	durationField(r.WaitTimeout, "redis.wait_timeout", &rc.WaitTimeout, errs)
	if rc.WaitTimeout < time.Millisecond || rc.WaitTimeout >= rc.Timeout {
		errs.add("redis.wait_timeout", "%v must be at least 1ms and less than redis.timeout (%v): WAIT runs inside the lease call", rc.WaitTimeout, rc.Timeout)
	}
}

// validateSentinel checks redis.sentinel: the master's name and at least
// one sentinel.
func validateSentinel(r *Sentinel, errs *Errors) *Sentinel {
	if r.MasterName == "" {
		errs.add("redis.sentinel.master_name", "is required: the name the sentinels monitor the master by (`sentinel monitor <name> ...`)")
	}
	if len(r.Addrs) == 0 {
		errs.add("redis.sentinel.addrs", "needs at least one sentinel's host:port")
	}
	hostPorts(r.Addrs, "redis.sentinel.addrs", errs)
	if r.PasswordEnv != "" && !envName.MatchString(r.PasswordEnv) {
		errs.add("redis.sentinel.password_env", "%q is not an environment variable name", r.PasswordEnv)
	}
	return &Sentinel{MasterName: r.MasterName, Addrs: r.Addrs, Username: r.Username, PasswordEnv: r.PasswordEnv}
}

// hostPorts reports each of addrs, listed at path, that is not host:port.
func hostPorts(addrs []string, path string, errs *Errors) {
	for i, a := range addrs {
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			errs.add(fmt.Sprintf("%s[%d]", path, i), "%q is not host:port", a)
		}
	}
}

// requireFile reports a missing or unreadable file named at path.
func requireFile(name, path string, errs *Errors) {
	if name == "" {
		errs.add(path, "is required")
		return
	}
	optionalFile(name, path, errs)
}

func optionalFile(name, path string, errs *Errors) {
	if name == "" {
		return
	}
	f, err := os.Open(name)
	if err != nil {
		errs.add(path, "%q cannot be read: %v", name, errors.Unwrap(err))
		return
	}
	f.Close()
}

func validatePlan(r rawPlan, path string, errs *Errors) Plan {
	if r.Unlimited {
		if r.Limit != 0 || r.Window != "" || r.Burst != 0 {
			errs.add(path, "an unlimited plan has no limit, window or burst; remove them")
		}
		return Plan{Unlimited: true}
	}
	p := Plan{Limit: r.Limit, Burst: r.Burst}
	if r.Limit < 1 || r.Limit > maxLimit {
		errs.add(path+".limit", "%d must be between 1 and %d", r.Limit, int64(maxLimit))
	}
	if r.Window == "" {
		errs.add(path+".window", "is required")
	} else {
		p.Window, p.Period = parseWindow(r.Window, path+".window", errs)
	}
	burstField(r.Burst, path+".burst", errs)
	refillField(p.Limit, p.Window, p.Burst, path+".burst", errs)
	return p
}

func validateClients(r *rawClients, plans map[string]Plan, errs *Errors, warnings *[]string) Clients {
	c := Clients{Header: DefaultKeyHeader, Bearer: true, Strip: true}
	if r.Header != "" {
		c.Header = strings.ToLower(r.Header)
		if !headerName.MatchString(r.Header) || strings.HasPrefix(r.Header, ":") {
			errs.add("clients.header", "%q is not a header name", r.Header)
		}
		if c.Header == "authorization" {
			errs.add("clients.header", "use bearer: true to read keys from authorization")
		}
	}
	if r.Bearer != nil {
		c.Bearer = *r.Bearer
	}
	if r.Strip != nil {
		c.Strip = *r.Strip
	}
	if r.AuthFailures != nil {
		af := validatePlan(*r.AuthFailures, "clients.auth_failures", errs)
		c.AuthFailures = &af
	}
	ids := map[string]int{}
	digests := map[[32]byte]int{}
	for i, k := range r.Keys {
		path := fmt.Sprintf("clients.keys[%d]", i)
		cl := Client{ID: k.ID, Plan: k.Plan}
		switch {
		case k.ID == "":
			errs.add(path+".id", "is required")
		case !policyName.MatchString(k.ID):
			errs.add(path+".id", "%q must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit", k.ID)
		}
		if prev, dup := ids[k.ID]; dup && k.ID != "" {
			errs.add(path+".id", "%q is already used by clients.keys[%d]", k.ID, prev)
		}
		ids[k.ID] = i
		switch {
		case k.SHA256 != "" && k.Key != "":
			errs.add(path, "give sha256 or key, not both")
		case k.SHA256 != "":
			if !hexDigest.MatchString(k.SHA256) {
				errs.add(path+".sha256", "must be 64 hex digits (from `extauthz hash-key`)")
			} else {
				b, _ := hex.DecodeString(k.SHA256)
				copy(cl.Digest[:], b)
			}
		case k.Key != "":
			cl.Digest = sha256.Sum256([]byte(k.Key))
			cl.Plaintext = true
			*warnings = append(*warnings, fmt.Sprintf("%s.key: plaintext key for client %q; store its sha256 instead (extauthz hash-key)", path, k.ID))
		default:
			errs.add(path, "needs sha256 (or key, for demos)")
		}
		if cl.Digest != ([32]byte{}) {
			if prev, dup := digests[cl.Digest]; dup {
				errs.add(path, "has the same key as clients.keys[%d]", prev)
			}
			digests[cl.Digest] = i
		}
		if k.Plan != "" {
			if _, ok := plans[k.Plan]; !ok {
				errs.add(path+".plan", "%q is not defined under plans%s", k.Plan, choices(plans))
			}
		}
		c.Keys = append(c.Keys, cl)
	}
	return c
}

func validatePolicy(r *rawPolicy, path string, c *Config, errs *Errors) Policy {
	p := Policy{
		Name:         r.Name,
		Burst:        r.Burst,
		OnMissingKey: MissingAnonymous,
		Shadow:       r.Shadow,
	}
	switch {
	case r.Name == "":
		errs.add(path+".name", "is required")
	case !policyName.MatchString(r.Name):
		errs.add(path+".name", "%q must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit", r.Name)
	}

	p.Match = validateMatch(&r.Match, path+".match", errs)

	if len(r.Key) > maxPolicyKeyParts {
		errs.add(path+".key", "has %d parts; at most %d", len(r.Key), maxPolicyKeyParts)
	}
	seen := map[string]bool{}
	for i, k := range r.Key {
		kp, err := parseKeyPart(k)
		if err != nil {
			errs.add(fmt.Sprintf("%s.key[%d]", path, i), "%q %s", k, err)
			continue
		}
		if seen[kp.String()] {
			errs.add(fmt.Sprintf("%s.key[%d]", path, i), "%q is listed twice", k)
		}
		seen[kp.String()] = true
		p.Key = append(p.Key, kp)
	}

	switch {
	case r.Unlimited:
		p.Unlimited = true
		if r.Limit.Set || r.Window != "" || r.Burst != 0 || r.Algorithm != "" {
			errs.add(path+".unlimited", "an unlimited policy has no limit, window, burst or algorithm; remove them")
		}
	case r.Limit.From != nil:
		validateLimitFrom(r.Limit.From, r.Window, r.Burst, path, &p, errs)
	case r.Limit.Value == "":
		errs.add(path+".limit", "is required (a number, plan, or {claim|header|metadata: ..., default: N, max: M}; or unlimited: true)")
	case r.Limit.Value == "plan":
		p.UsePlan = true
		if r.Window != "" {
			errs.add(path+".window", "comes from the plan when limit is plan; remove it")
		}
		if r.Burst != 0 {
			errs.add(path+".burst", "comes from the plan when limit is plan; set it there")
		}
	default:
		n, err := strconv.ParseInt(r.Limit.Value, 10, 64)
		if err != nil || n < 1 || n > maxLimit {
			errs.add(path+".limit", "%q must be an integer between 1 and %d, or plan", r.Limit.Value, int64(maxLimit))
		}
		p.Limit = n
		if r.Window == "" {
			errs.add(path+".window", "is required")
		} else {
			p.Window, p.Period = parseWindow(r.Window, path+".window", errs)
		}
	}
	limit := validatePolicyLimit(r, path, &p, c, errs)
	p.Algorithm, p.Queue, p.MaxDelay, p.Mode, p.OnRedisError, p.Charge = limit.Algorithm, limit.Queue, limit.MaxDelay, limit.Mode, limit.OnRedisError, limit.Charge
	p.BlockFor = limit.BlockFor
	validateCalendar(r, path, &p, c, errs)
	warnLeakyBucket(path, &p, c)
	validateCost(&r.Cost, path+".cost", &p, c, errs)
	switch {
	case p.Charge == ChargeAlways && r.Cost.Set:
		errs.add(path+".cost", "does not apply to charge: always: Check cannot see the response, so it only asks whether budget is left (0 units); charge the units through the rate limit service (a descriptor with rate_limit.policy: %s and Envoy's apply_on_stream_done); remove cost", p.Name)
	case p.Charge == ChargeAlways && p.Unlimited:
		errs.add(path+".charge", "an unlimited policy keeps no count to charge; remove it")
	}
	switch {
	case r.BlockFor == "":
	case p.Unlimited:
		errs.add(path+".block_for", "an unlimited policy never denies, so nothing starts a block; remove it")
	case r.Shadow:
		c.Warnings = append(c.Warnings, fmt.Sprintf("%s.block_for: has no effect with shadow: true (a shadow denial never blocks)", path))
	}

	if r.OnMissingKey != "" {
		switch v := OnMissingKey(r.OnMissingKey); v {
		case MissingAnonymous, MissingReject:
			p.OnMissingKey = v
		default:
			errs.add(path+".on_missing_key", "%q is not a choice; choices are anonymous, reject", r.OnMissingKey)
		}
	}

	if r.PlanFrom != "" {
		kp, err := parseKeyPart(r.PlanFrom)
		switch {
		case err != nil || (kp.Kind != KeyClaim && kp.Kind != KeyHeader):
			errs.add(path+".plan_from", "%q must be claim:NAME (a verified JWT claim) or header:NAME (set by a trusted filter)", r.PlanFrom)
		case p.LimitFrom.From != CostConstant:
			errs.add(path+".plan_from", "applies to limit: plan only; this policy's limit is read from each request (%s), and takes no plan", p.LimitFrom.RequestValue)
		case !p.UsePlan:
			errs.add(path+".plan_from", "applies to limit: plan only")
		default:
			p.PlanFrom = kp
		}
	}
	if p.UsePlan {
		// Callers without a plan of their own use plans.default; say so
		// now rather than failing requests later.
		_, hasDefault := c.Plans[DefaultPlan]
		if !hasDefault && p.PlanFrom.Kind != "" {
			errs.add(path+".plan_from", "needs plans.%s, the plan of names that are not under plans", DefaultPlan)
		} else if !hasDefault {
			if p.OnMissingKey == MissingAnonymous || !hasPart(p.Key, KeyClient) {
				errs.add(path+".limit", "plan needs plans.%s for callers without a client plan (or key: [client] with on_missing_key: reject)", DefaultPlan)
			} else {
				for i, k := range c.Clients.Keys {
					if k.Plan == "" {
						errs.add(path+".limit", "plan needs plans.%s: clients.keys[%d] (%q) has no plan", DefaultPlan, i, k.ID)
						break
					}
				}
			}
		}
	}
	return p
}

// policyPlace is where a policy's limit is written: this file, whose
// leaky buckets hold a Check, which Envoy's ext_authz filter gives 200ms.
var policyPlace = LimitPlace{
	CountField:       "limit",
	DefaultAlgorithm: TokenBucket,
	RedisSection:     "a redis section",
	DefaultMaxDelay:  DefaultMaxDelay,
	HeldCall:         "a held request must be answered within Envoy's ext_authz timeout (200ms by default), with room for the Redis call",
}

// validatePolicyLimit checks the settings a policy shares with every
// limit (ValidateLimit): its counts are its own limit, or each plan's for
// limit: plan. A calendar window is counted by fixed_window unless told
// otherwise (validateCalendar refuses any other).
func validatePolicyLimit(r *rawPolicy, path string, p *Policy, c *Config, errs *Errors) LimitSettings {
	place := policyPlace
	place.DefaultMode, place.Redis, place.Local = c.DefaultMode, c.Redis != nil, c.Local
	if r.Calendar {
		place.DefaultAlgorithm = FixedWindow
	}
	f := LimitFields{Algorithm: r.Algorithm, Burst: r.Burst, Queue: r.Queue, MaxDelay: r.MaxDelay, Mode: r.Mode, OnRedisError: r.OnRedisError, Charge: r.Charge, BlockFor: r.BlockFor}
	if p.UsePlan {
		for _, name := range sortedKeys(c.Plans) {
			plan := c.Plans[name]
			f.Counts = append(f.Counts, LimitCount{Of: "plans." + name + ".limit", N: plan.Limit, Window: plan.Window})
		}
	} else if p.LimitFrom.From != CostConstant {
		// Any limit from 1 to max: bound what a log may hold by max
		// (validateLimitFrom checks the burst's refill at 1).
		f.Counts = []LimitCount{{Of: "limit.max", N: p.LimitFrom.Max, Window: p.Window}}
	} else {
		f.Counts = []LimitCount{{N: p.Limit, Window: p.Window}}
	}
	return ValidateLimit(&f, path, &place, errs)
}

func hasPart(parts []KeyPart, kind KeyKind) bool {
	for _, k := range parts {
		if k.Kind == kind {
			return true
		}
	}
	return false
}

func validateMatch(r *rawMatch, path string, errs *Errors) Match {
	return validateMatchDepth(r, path, 0, errs)
}

func validateMatchDepth(r *rawMatch, path string, depth int, errs *Errors) Match {
	m := Match{PathPrefix: r.PathPrefix, Context: r.Context}
	m.Headers = validateValueMatches(r.Headers, path+".headers", true, errs)
	m.Claims = validateValueMatches(r.Claims, path+".claims", false, errs)
	m.SourceCIDRs = validateCIDRs(r.SourceCIDRs, path+".source_cidrs", errs)
	if r.Not != nil {
		switch not := validateMatchDepth(r.Not, path+".not", depth+1, errs); {
		case depth+1 >= maxMatchDepth:
			errs.add(path+".not", "nests %d levels deep; at most %d", depth+1, maxMatchDepth-1)
		case not.empty():
			errs.add(path+".not", "has no condition: it would match every request, and the policy none")
		default:
			m.Not = &not
		}
	}
	if r.PathPrefix != "" && !strings.HasPrefix(r.PathPrefix, "/") {
		errs.add(path+".path_prefix", "%q must start with /", r.PathPrefix)
	}
	for i, meth := range r.Methods {
		if !httpMethod.MatchString(meth) {
			errs.add(fmt.Sprintf("%s.methods[%d]", path, i), "%q is not an HTTP method", meth)
		}
		m.Methods = append(m.Methods, strings.ToUpper(meth))
	}
	for i, h := range r.Hosts {
		h = NormalizeHost(h)
		if h == "" || strings.ContainsAny(h, "/ ") || strings.Contains(h[1:], "*") || (h[0] == '*' && !strings.HasPrefix(h, "*.")) {
			errs.add(fmt.Sprintf("%s.hosts[%d]", path, i), "%q is not a host name (a leading *. matches subdomains)", r.Hosts[i])
		}
		m.Hosts = append(m.Hosts, h)
	}
	return m
}

func parseKeyPart(s string) (KeyPart, error) {
	kind, name, hasName := strings.Cut(s, ":")
	switch KeyKind(kind) {
	case KeyClient, KeyIP, KeyPrincipal, KeyPath:
		if hasName {
			return KeyPart{}, fmt.Errorf("takes no name")
		}
		return KeyPart{Kind: KeyKind(kind)}, nil
	case KeyHeader:
		if !headerName.MatchString(name) {
			return KeyPart{}, fmt.Errorf("needs a header name: header:NAME")
		}
		return KeyPart{Kind: KeyHeader, Name: strings.ToLower(name)}, nil
	case KeyClaim:
		if name == "" {
			return KeyPart{}, fmt.Errorf("needs a claim name: claim:NAME")
		}
		return KeyPart{Kind: KeyClaim, Name: name}, nil
	}
	return KeyPart{}, fmt.Errorf("is not a key source; choices are client, ip, header:NAME, claim:NAME, principal, path")
}

func parseMode(s string) (Mode, bool) {
	switch m := Mode(s); m {
	case ModeLocal, ModeRedis, ModeHybrid:
		return m, true
	}
	return "", false
}

// durationField parses s into *d when s is given; a missing value keeps the default.
func durationField(s, path string, d *time.Duration, errs *Errors) {
	if s == "" {
		return
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		errs.add(path, "%q is not a duration (like 250ms, 1s, 1m)", s)
		return
	}
	if v <= 0 {
		errs.add(path, "%q must be positive", s)
		return
	}
	*d = v
}

func windowField(s, path string, d *time.Duration, errs *Errors) {
	var v time.Duration
	durationField(s, path, &v, errs)
	if v == 0 {
		return
	}
	if problem := WindowProblem(v); problem != "" {
		errs.add(path, "%q %s", s, problem)
		return
	}
	*d = v
}

func choices[V any](m map[string]V) string {
	if len(m) == 0 {
		return " (none are defined)"
	}
	return "; choices are " + strings.Join(sortedKeys(m), ", ")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
