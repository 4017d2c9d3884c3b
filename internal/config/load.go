package config

import (
	"crypto/sha256"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"

	"go.yaml.in/yaml/v3"
)

// The raw types mirror the YAML. Durations and limits stay strings here so
// that validation, which knows each field's path, reports bad values. A
// section whose settings are already what Config holds (headers, http,
// listen.tls, redis.sentinel, rls.limit_headers: strings and booleans,
// defaults applied by validation) is decoded into Config's own type,
// whose yaml tags name its keys.

type rawConfig struct {
	Listen        rawListen          `yaml:"listen"`
	Redis         *rawRedis          `yaml:"redis"`
	DefaultMode   string             `yaml:"default_mode"`
	Local         rawLocal           `yaml:"local"`
	IPTrustedHops int                `yaml:"ip_trusted_hops"`
	IPv4Prefix    *int               `yaml:"ipv4_prefix"`
	IPv6Prefix    *int               `yaml:"ipv6_prefix"`
	Headers       Headers            `yaml:"headers"`
	HTTP          HTTP               `yaml:"http"`
	Fallback      rawFallback        `yaml:"fallback"`
	Clients       rawClients         `yaml:"clients"`
	Plans         map[string]rawPlan `yaml:"plans"`
	Policies      []rawPolicy        `yaml:"policies"`
	RLS           rawRLS             `yaml:"rls"`
	RLQS          rawRLQS            `yaml:"rlqs"`
}

type rawListen struct {
	GRPC       *string    `yaml:"grpc"`
	HTTP       string     `yaml:"http"`
	Admin      *string    `yaml:"admin"`
	Reflection *bool      `yaml:"reflection"` // nil: on
	TLS        *ServerTLS `yaml:"tls"`

	MaxConnections *int `yaml:"max_connections"` // nil: DefaultMaxConnections
}

type rawRedis struct {
	Addrs       []string     `yaml:"addrs"`
	Sentinel    *Sentinel    `yaml:"sentinel"`
	Username    string       `yaml:"username"`
	PasswordEnv string       `yaml:"password_env"`
	TLS         rawClientTLS `yaml:"tls"`
	Timeout     string       `yaml:"timeout"`
	KeyPrefix   *string      `yaml:"key_prefix"`
	PoolSize    int          `yaml:"pool_size"`
	// WaitReplicas and WaitTimeout: WAIT after hybrid lease calls.
	WaitReplicas int    `yaml:"wait_replicas"`
	WaitTimeout  string `yaml:"wait_timeout"`
}

// rawClientTLS is `tls: true|false` or a mapping of TLS settings (which
// turns TLS on).
type rawClientTLS struct {
	Enabled            bool   `yaml:"-"`
	CAFile             string `yaml:"ca_file"`
	CertFile           string `yaml:"cert_file"`
	KeyFile            string `yaml:"key_file"`
	ServerName         string `yaml:"server_name"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
}

func (t *rawClientTLS) decodeNode(n *yaml.Node, path string, errs *Errors) {
	switch n.Kind {
	case yaml.ScalarNode:
		if err := n.Decode(&t.Enabled); err != nil {
			errs.add(path, "%q is not true, false or a mapping of TLS settings", n.Value)
		}
	case yaml.MappingNode:
		t.Enabled = true
		type fields rawClientTLS // the same fields, without this method
		decodeValue(n, reflect.ValueOf((*fields)(t)).Elem(), path, errs)
	default:
		errs.add(path, "expected true, false or a mapping of TLS settings, got %s", describe(n))
	}
}

type rawLocal struct {
	MaxKeys     int    `yaml:"max_keys"`
	SliceIdle   string `yaml:"slice_idle"`
	LeaseTTL    string `yaml:"lease_ttl"`
	MaxLogBytes string `yaml:"max_log_bytes"`
}

type rawRLS struct {
	Domains         []string      `yaml:"domains"`
	ResponseHeaders *bool         `yaml:"response_headers"`
	OnUndecodable   string        `yaml:"on_undecodable"`
	ShadowMode      bool          `yaml:"shadow_mode"`
	QuotaMode       bool          `yaml:"quota_mode"`
	DynamicMetadata bool          `yaml:"dynamic_metadata"`
	LimitHeaders    *LimitHeaders `yaml:"limit_headers"`
	Counting        string        `yaml:"counting"`
}

type rawFallback struct {
	PeerTTL  string `yaml:"peer_ttl"`
	MinPeers int    `yaml:"min_peers"`
}

type rawClients struct {
	Header       string      `yaml:"header"`
	Bearer       *bool       `yaml:"bearer"`
	Strip        *bool       `yaml:"strip"`
	Keys         []rawClient `yaml:"keys"`
	AuthFailures *rawPlan    `yaml:"auth_failures"`
}

type rawClient struct {
	ID     string `yaml:"id"`
	SHA256 string `yaml:"sha256"`
	Key    string `yaml:"key"`
	Plan   string `yaml:"plan"`
}

type rawPlan struct {
	Limit     int64  `yaml:"limit"`
	Window    string `yaml:"window"`
	Burst     int64  `yaml:"burst"`
	Unlimited bool   `yaml:"unlimited"`
}

type rawPolicy struct {
	Name         string   `yaml:"name"`
	Match        rawMatch `yaml:"match"`
	Key          []string `yaml:"key"`
	Limit        rawLimit `yaml:"limit"`
	Window       string   `yaml:"window"`
	Burst        int64    `yaml:"burst"`
	Algorithm    string   `yaml:"algorithm"`
	Queue        *int64   `yaml:"queue"`
	MaxDelay     string   `yaml:"max_delay"`
	Mode         string   `yaml:"mode"`
	OnRedisError string   `yaml:"on_redis_error"`
	Charge       string   `yaml:"charge"`
	BlockFor     string   `yaml:"block_for"`
	OnMissingKey string   `yaml:"on_missing_key"`
	Shadow       bool     `yaml:"shadow"`
	Cost         rawCost  `yaml:"cost"`
	Unlimited    bool     `yaml:"unlimited"`
	PlanFrom     string   `yaml:"plan_from"`
	Calendar     bool     `yaml:"calendar"`
	TimeZone     string   `yaml:"time_zone"`
}

type rawMatch struct {
	PathPrefix  string            `yaml:"path_prefix"`
	Methods     []string          `yaml:"methods"`
	Hosts       []string          `yaml:"hosts"`
	Context     map[string]string `yaml:"context"`
	Headers     []rawValueMatch   `yaml:"headers"`
	Claims      []rawValueMatch   `yaml:"claims"`
	SourceCIDRs []string          `yaml:"source_cidrs"`
	Not         *rawMatch         `yaml:"not"`
}

//go:embed default.yaml
var defaultYAML []byte

// EmbeddedSource names the built-in configuration in messages.
const EmbeddedSource = "embedded default"

// Default returns the embedded configuration: local mode, no Redis, a demo
// policy. It works on a fresh machine.
func Default() *Config {
	c, err := Parse(defaultYAML, EmbeddedSource)
	if err != nil {
		panic("config: embedded default is invalid: " + err.Error())
	}
	return c
}

// Load reads and validates the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(data, path)
}

// Parse validates a configuration. name appears in front of every error.
func Parse(data []byte, name string) (*Config, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &Errors{File: name, List: []FieldError{{Msg: yamlSyntax(err)}}}
	}
	errs := &Errors{File: name}
	var raw rawConfig
	decodeStrict(&doc, &raw, errs)
	if len(errs.List) > 0 {
		return nil, errs
	}
	c := validate(&raw, errs)
	if err := errs.orNil(); err != nil {
		return nil, err
	}
	c.Source = name
	c.RLS.Domains = resolvePaths(c.RLS.Domains, name)
	c.Digest = sha256.Sum256(data)
	return c, nil
}

// resolvePaths makes relative paths relative to the directory of the
// configuration file named name.
func resolvePaths(paths []string, name string) []string {
	if len(paths) == 0 {
		return nil
	}
	out := make([]string, len(paths))
	for i, p := range paths {
		if !filepath.IsAbs(p) && name != EmbeddedSource {
			p = filepath.Join(filepath.Dir(name), p)
		}
		out[i] = p
	}
	return out
}

func yamlSyntax(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		return te.Error()
	}
	return "invalid YAML: " + err.Error()
}
