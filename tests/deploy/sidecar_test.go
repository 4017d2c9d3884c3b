package deploy

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// sidecarConfig is the part of an extauthz configuration the deployment
// checks read: where it listens and what it expects from Envoy. The real
// loader (`extauthz validate`) checks the whole file; this view is decoded
// leniently so it never disagrees with the loader about the rest.
type sidecarConfig struct {
	Listen struct {
		GRPC  string `json:"grpc"`
		HTTP  string `json:"http"`
		Admin string `json:"admin"`
	} `json:"listen"`
	Redis *struct {
		Addrs    []string `json:"addrs"`
		Sentinel *struct {
			MasterName  string   `json:"master_name"`
			Addrs       []string `json:"addrs"`
			PasswordEnv string   `json:"password_env"`
		} `json:"sentinel"`
		PasswordEnv string `json:"password_env"`
		Timeout     string `json:"timeout"`
	} `json:"redis"`
	DefaultMode   string `json:"default_mode"`
	IPTrustedHops int    `json:"ip_trusted_hops"`
	Fallback      struct {
		MinPeers *int64 `json:"min_peers"`
	} `json:"fallback"`
	Clients struct {
		Header string     `json:"header"`
		Bearer *bool      `json:"bearer"`
		Keys   []struct{} `json:"keys"`
	} `json:"clients"`
	Policies []struct {
		Name  string `json:"name"`
		Match struct {
			Context map[string]string `json:"context"`
		} `json:"match"`
		Key    []string `json:"key"`
		Mode   string   `json:"mode"`
		Charge string   `json:"charge"`
	} `json:"policies"`
	RLS struct {
		Domains []string `json:"domains"`
	} `json:"rls"`
	RLQS rlqsSection `json:"rlqs"`

	// domains are the rate limit service's descriptor files, by domain,
	// once loadDomains has read them.
	domains map[string]*rlDomain
}

func parseSidecarConfig(data []byte) (*sidecarConfig, error) {
	var c sidecarConfig
	if err := yaml.Unmarshal(data, &c); err != nil {
		return nil, err
	}
	// Shipped configs say where they listen rather than lean on defaults:
	// the reader of a manifest should not need the source to know.
	if c.Listen.GRPC == "" || c.Listen.Admin == "" {
		return nil, fmt.Errorf("listen.grpc and listen.admin must be set explicitly")
	}
	return &c, nil
}

// breakerVerdict is the longest extauthz takes to mark a frozen Redis down
// (internal/breaker/breaker.go: a 50ms stall, a 25ms watch tick and a
// 100ms probe); a decision in flight then falls back at once. Envoy's
// ext_authz timeout must be longer, or such decisions become Envoy's
// failure_mode answer instead of extauthz's fallback.
const breakerVerdict = 175 * time.Millisecond

// keyHeader is the header API keys come in, lower case.
func (c *sidecarConfig) keyHeader() string {
	if c.Clients.Header == "" {
		return "x-api-key" // the loader's default
	}
	return strings.ToLower(c.Clients.Header)
}

// redisTimeout is redis.timeout, or the loader's default.
func (c *sidecarConfig) redisTimeout() time.Duration {
	if c.Redis != nil {
		if d, err := time.ParseDuration(c.Redis.Timeout); err == nil && d > 0 {
			return d
		}
	}
	return 150 * time.Millisecond
}

// usesClaims reports whether any policy keys on a JWT claim.
func (c *sidecarConfig) usesClaims() bool {
	for _, p := range c.Policies {
		for _, k := range p.Key {
			if strings.HasPrefix(k, "claim:") {
				return true
			}
		}
	}
	return false
}

// usesRedis reports whether any policy counts in Redis.
func (c *sidecarConfig) usesRedis() bool {
	if c.Redis == nil {
		return false
	}
	mode := c.DefaultMode
	if mode == "" {
		mode = "hybrid" // the loader's default with a redis section
	}
	for _, p := range c.Policies {
		m := p.Mode
		if m == "" {
			m = mode
		}
		if m != "local" {
			return true
		}
	}
	return false
}

// contextSelects reports whether a policy's match.context selects a request
// carrying ext (every given key must match).
func contextSelects(want, ext map[string]string) bool {
	for k, v := range want {
		if ext[k] != v {
			return false
		}
	}
	return true
}

// grpcEndpoint is where the sidecar serves Check: a TCP host and port, or a
// unix socket path.
type grpcEndpoint struct {
	host string
	port uint32
	unix string
}

func (c *sidecarConfig) grpcEndpoint() (grpcEndpoint, error) {
	return parseListen(c.Listen.GRPC)
}

func parseListen(addr string) (grpcEndpoint, error) {
	if path, ok := strings.CutPrefix(addr, "unix://"); ok {
		return grpcEndpoint{unix: path}, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return grpcEndpoint{}, err
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return grpcEndpoint{}, fmt.Errorf("%q: needs a fixed port", addr)
	}
	return grpcEndpoint{host: host, port: uint32(n)}, nil
}

// reaches reports whether a connection to addr:port lands on a listener
// bound to e: the same port, and the same address or a wildcard.
func (e grpcEndpoint) reaches(addr string, port uint32) bool {
	if e.unix != "" || e.port != port {
		return false
	}
	switch e.host {
	case "", "0.0.0.0", "::", "[::]":
		return true
	}
	a, b := net.ParseIP(e.host), net.ParseIP(addr)
	if a != nil && b != nil {
		return a.Equal(b)
	}
	return e.host == addr
}

// isLoopback reports whether e accepts only same-host connections.
func (e grpcEndpoint) isLoopback() bool {
	if e.unix != "" {
		return true
	}
	ip := net.ParseIP(e.host)
	return ip != nil && ip.IsLoopback() || e.host == "localhost"
}
