package config

import (
	"encoding/hex"
	"errors"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// FuzzParse: Parse never panics; it returns a Config or an *Errors, never
// both and never neither; every error names the file and has a message;
// the same input gives the same answer; and a returned Config re-validates:
// rendered back to YAML and parsed again, it is the same Config.
func FuzzParse(f *testing.F) {
	for _, name := range []string{"testdata/full.yaml", "default.yaml"} {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(everySetting))
	for _, s := range []string{
		"", "{}", "null", "[]", "policies: x", "policies: [{name: a, limit: 1, window: 1s, key: ip}]",
		"a: &a [*a]", "x: &x {y: 1}\npolicies: [*x]", "plans: {free: {limit: 1, window: 1m}}\npolicies: [{name: p, limit: plan}]",
		"clients: {keys: [{id: a, key: k}, {id: b, sha256: 0000000000000000000000000000000000000000000000000000000000000000}]}",
		"\"a\\nb\": 1", "policies:\n  - name: p\n    limit: '1'\n    window: 1m\n    match: {context: {a: b}, hosts: ['*.x'], methods: [get]}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		const name = "fuzz.yaml"
		c, err := Parse(data, name)
		if (c == nil) == (err == nil) {
			t.Fatalf("Parse = %v, %v: want exactly one of a Config and an error", c, err)
		}
		_, err2 := Parse(data, name)
		if errString(err) != errString(err2) {
			t.Fatalf("Parse is not deterministic:\n%v\n---\n%v", err, err2)
		}
		if err != nil {
			var es *Errors
			if !errors.As(err, &es) || es.File != name || len(es.List) == 0 {
				t.Fatalf("error %T %q: want *Errors naming %s", err, err, name)
			}
			for _, fe := range es.List {
				if strings.TrimSpace(fe.Msg) == "" {
					t.Fatalf("error without a message: %+v", fe)
				}
			}
			if !strings.HasPrefix(err.Error(), name+": ") {
				t.Fatalf("error %q lacks the file prefix", err)
			}
			return
		}
		if c.Source != name {
			t.Fatalf("Source = %q", c.Source)
		}
		text := render(t, c)
		c2, err := Parse(text, "rendered.yaml")
		if err != nil {
			t.Fatalf("a valid Config rendered back does not validate: %v\n%s", err, text)
		}
		if a, b := comparable(c), comparable(c2); !reflect.DeepEqual(a, b) {
			t.Fatalf("Parse(render(c)) differs from c:\n%+v\n---\n%+v\nrendered:\n%s", a, b, text)
		}
	})
}

// comparable is c without what render does not carry (its source, its
// warnings, whether keys were given in the clear) and with empty maps nil.
func comparable(c *Config) Config {
	x := *c
	x.Source, x.Digest, x.Warnings = "", [32]byte{}, nil
	x.Clients.Keys = nil
	for _, k := range c.Clients.Keys {
		k.Plaintext = false
		x.Clients.Keys = append(x.Clients.Keys, k)
	}
	x.Policies = nil
	for _, p := range c.Policies {
		if len(p.Match.Context) == 0 {
			p.Match.Context = nil
		}
		x.Policies = append(x.Policies, p)
	}
	return x
}

// everySetting sets what full.yaml leaves at its defaults: both TLS
// sections (validation only opens the files) and every algorithm.
const everySetting = `
listen: {grpc: "0.0.0.0:9001", admin: "", tls: {cert_file: testdata/full.yaml, key_file: testdata/full.yaml, client_ca_file: testdata/full.yaml}}
redis: {addrs: [a:1, b:2], tls: {ca_file: testdata/full.yaml, server_name: r, insecure_skip_verify: true}}
ipv4_prefix: 24
ipv6_prefix: 56
clients: {auth_failures: {limit: 5, window: 1m, burst: 10}}
policies:
  - {name: lb, limit: 10, window: 1s, algorithm: leaky_bucket, queue: 3, max_delay: 120ms, mode: redis}
  - {name: lb2, limit: 10, window: 1s, algorithm: leaky_bucket}
  - {name: sw, limit: 10, window: 1s, algorithm: sliding_window, on_redis_error: deny}
  - {name: fw, limit: 10, window: 1s, algorithm: fixed_window, mode: local}
  - {name: sl, limit: 10, window: 1s, algorithm: sliding_log, shadow: true}
rls: {domains: [ratelimit/, /etc/ratelimit/edge.yaml], response_headers: false}
`

// A Config renders back to itself: checked on the complete example and on
// everySetting, so a field added to Config but not to render fails here,
// not by chance in a fuzz run.
func TestRenderRoundTrip(t *testing.T) {
	t.Setenv("REDIS_PASSWORD", "x")
	for _, name := range []string{"testdata/full.yaml", "default.yaml", "everySetting"} {
		var c *Config
		var err error
		if name == "everySetting" {
			c, err = Parse([]byte(everySetting), name)
		} else {
			c, err = Load(name)
		}
		if err != nil {
			t.Fatal(err)
		}
		c2, err := Parse(render(t, c), "rendered.yaml")
		if err != nil {
			t.Fatalf("%s rendered: %v", name, err)
		}
		if a, b := comparable(c), comparable(c2); !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: Parse(render(c)) differs from c:\n%+v\n---\n%+v", name, a, b)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// render writes c back as YAML with every field explicit: keys as sha256,
// durations and limits as strings. It is the inverse of Parse up to
// defaults, plaintext keys and warnings.
func render(t *testing.T, c *Config) []byte {
	t.Helper()
	listen := map[string]any{"grpc": c.Listen.GRPC, "http": c.Listen.HTTP, "admin": c.Listen.Admin, "reflection": c.Listen.Reflection, "max_connections": c.Listen.MaxConnections}
	if tl := c.Listen.TLS; tl != nil {
		listen["tls"] = map[string]any{"cert_file": tl.CertFile, "key_file": tl.KeyFile, "client_ca_file": tl.ClientCAFile}
	}
	doc := map[string]any{
		"listen":          listen,
		"default_mode":    string(c.DefaultMode),
		"local":           map[string]any{"max_keys": c.Local.MaxKeys, "slice_idle": c.Local.SliceIdle.String(), "lease_ttl": c.Local.LeaseTTL.String(), "max_log_bytes": strconv.FormatInt(c.Local.MaxLogBytes, 10)},
		"ip_trusted_hops": c.IPTrustedHops,
		"ipv4_prefix":     c.IPv4Prefix,
		"ipv6_prefix":     c.IPv6Prefix,
		"headers":         map[string]any{"legacy": c.Headers.Legacy},
		"http":            map[string]any{"uri_header": c.HTTP.URIHeader, "method_header": c.HTTP.MethodHeader},
		"fallback":        map[string]any{"peer_ttl": c.Fallback.PeerTTL.String(), "min_peers": c.Fallback.MinPeers},
	}
	if r := c.Redis; r != nil {
		var tls any = false
		if ct := r.TLS; ct != nil {
			tls = map[string]any{
				"ca_file": ct.CAFile, "cert_file": ct.CertFile, "key_file": ct.KeyFile,
				"server_name": ct.ServerName, "insecure_skip_verify": ct.InsecureSkipVerify,
			}
		}
		redis := map[string]any{
			"addrs": r.Addrs, "username": r.Username, "password_env": r.PasswordEnv, "tls": tls,
			"timeout": r.Timeout.String(), "key_prefix": r.KeyPrefix,
		}
		if r.WaitReplicas > 0 {
			redis["wait_replicas"], redis["wait_timeout"] = r.WaitReplicas, r.WaitTimeout.String()
		}
		doc["redis"] = redis
	}
	keys := []any{}
	for _, k := range c.Clients.Keys {
		m := map[string]any{"id": k.ID, "sha256": hex.EncodeToString(k.Digest[:])}
		if k.Plan != "" {
			m["plan"] = k.Plan
		}
		keys = append(keys, m)
	}
	clients := map[string]any{"header": c.Clients.Header, "bearer": c.Clients.Bearer, "strip": c.Clients.Strip, "keys": keys}
	if af := c.Clients.AuthFailures; af != nil {
		clients["auth_failures"] = map[string]any{"limit": af.Limit, "window": af.Window.String(), "burst": af.Burst}
	}
	doc["clients"] = clients
	plans := map[string]any{}
	for name, p := range c.Plans {
		plans[name] = map[string]any{"limit": p.Limit, "window": p.Window.String(), "burst": p.Burst}
	}
	doc["plans"] = plans
	policies := []any{}
	for _, p := range c.Policies {
		key := []string{}
		for _, k := range p.Key {
			key = append(key, k.String())
		}
		m := map[string]any{
			"name": p.Name,
			"match": map[string]any{
				"path_prefix": p.Match.PathPrefix, "methods": orEmpty(p.Match.Methods),
				"hosts": orEmpty(p.Match.Hosts), "context": p.Match.Context,
			},
			"key": key, "algorithm": string(p.Algorithm), "mode": string(p.Mode),
			"on_redis_error": string(p.OnRedisError), "on_missing_key": string(p.OnMissingKey), "shadow": p.Shadow,
		}
		if p.Algorithm == LeakyBucket {
			m["max_delay"] = p.MaxDelay.String()
			if p.Queue >= 0 {
				m["queue"] = p.Queue
			}
		}
		if p.UsePlan {
			m["limit"] = "plan"
		} else {
			m["limit"] = strconv.FormatInt(p.Limit, 10)
			m["window"] = p.Window.String()
			m["burst"] = p.Burst
		}
		policies = append(policies, m)
	}
	doc["policies"] = policies
	doc["rls"] = map[string]any{"domains": orEmpty(c.RLS.Domains), "response_headers": c.RLS.ResponseHeaders, "on_undecodable": c.RLS.OnUndecodable}
	out, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return out
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
