package check

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/identity"
	"github.com/extauthz/extauthz/internal/metrics"
	"github.com/extauthz/extauthz/internal/quota"
)

// Limiters maps each mode to the limiter that keeps its counts.
type Limiters map[config.Mode]quota.Limiter

// maxKeyValue is the longest key component kept verbatim. Longer values
// (a 64 KiB header chosen as a key, say) are replaced by their SHA-256, so a
// partition key stays short whatever a request carries, and distinct values
// stay distinct. A component a request controls thus adds at most
// 3 × maxKeyValue bytes to a key (every byte percent-encoded); with
// config's limit of 8 key parts, at most 3 KiB, plus the policy's names.
const maxKeyValue = 128

// engine is one compiled configuration. It is immutable (but for the flag
// that logs a warning once): a reload compiles a new engine and swaps it
// in, so a Check sees one configuration throughout.
type engine struct {
	cfg       *config.Config
	keyring   *identity.Keyring[client]
	keyHeader string // clients.header, lower case
	policies  []*policy
	hold      holdFunc // waits out a leaky bucket's delay

	warn          *slog.Logger // nil: warnings are not logged
	warnedTooMany atomic.Bool  // a MaxPoliciesPerRequest refusal was logged
}

// client is a known API key holder, with what every response about it
// carries rendered once: responses share these read-only values.
type client struct {
	ID       string
	Plan     string // "" when none
	idHeader *corev3.HeaderValueOption
	idValue  *structpb.Value
}

type policy struct {
	config.Policy
	limiter quota.Limiter
	fixed   limit            // the policy's own limit, unless UsePlan
	plans   map[string]limit // UsePlan: by plan name; "" holds plans.default
	prefix  string           // partition key prefix: the escaped name
	nameVal *structpb.Value  // the name, for dynamic metadata

	allowed, denied, shadowDenied, refunded prometheus.Counter
	degraded                                [4]prometheus.Counter // by quota.Degraded
}

// limit is a quota.Limit with its RateLimit-Policy header rendered once.
type limit struct {
	quota.Limit
	header    string
	policyOpt *corev3.HeaderValueOption // ratelimit-policy: header
}

func compile(cfg *config.Config, limiters Limiters, m *metrics.Metrics) (*engine, error) {
	e := &engine{
		cfg:       cfg,
		keyring:   identity.NewKeyring[client](len(cfg.Clients.Keys)),
		keyHeader: cfg.Clients.Header,
	}
	for _, k := range cfg.Clients.Keys {
		e.keyring.Add(k.Digest, &client{
			ID:       k.ID,
			Plan:     k.Plan,
			idHeader: header(ClientIDHeader, k.ID),
			idValue:  structpb.NewStringValue(k.ID),
		})
	}
	for _, pc := range cfg.Policies {
		lim, ok := limiters[pc.Mode]
		if !ok || lim == nil {
			return nil, fmt.Errorf("policy %q: mode %s needs Redis, and this process started without a redis section (adding one takes a restart)", pc.Name, pc.Mode)
		}
		p := &policy{
			Policy:  pc,
			limiter: lim,
			prefix:  string(appendEscaped(nil, pc.Name)),
			nameVal: structpb.NewStringValue(pc.Name),
		}
		if pc.UsePlan {
			p.plans = make(map[string]limit, len(cfg.Plans))
			for name, plan := range cfg.Plans {
				l := newLimit(pc, plan.Limit, plan.Window, plan.Burst)
				p.plans[name] = l
				if name == config.DefaultPlan {
					p.plans[""] = l
				}
			}
		} else {
			p.fixed = newLimit(pc, pc.Limit, pc.Window, pc.Burst)
		}
		mode := string(pc.Mode)
		p.allowed = m.Decisions.WithLabelValues(pc.Name, mode, "allowed")
		p.denied = m.Decisions.WithLabelValues(pc.Name, mode, "denied")
		p.shadowDenied = m.Decisions.WithLabelValues(pc.Name, mode, "shadow_denied")
		p.refunded = m.Decisions.WithLabelValues(pc.Name, mode, "refunded")
		for _, d := range []quota.Degraded{quota.DegradedFallback, quota.DegradedAllow, quota.DegradedDeny} {
			p.degraded[d] = m.Degraded.WithLabelValues(pc.Name, d.String())
		}
		e.policies = append(e.policies, p)
	}
	return e, nil
}

func newLimit(p config.Policy, n int64, window time.Duration, burst int64) limit {
	onError := map[config.OnRedisError]quota.OnError{
		config.OnErrorFallback: quota.ErrorFallback,
		config.OnErrorAllow:    quota.ErrorAllow,
		config.OnErrorDeny:     quota.ErrorDeny,
	}[p.OnRedisError]
	h := policyHeader(p.Name, n, window)
	return limit{
		Limit: quota.Limit{Algorithm: p.Algorithm, Limit: n, Window: window, Burst: burst, OnError: onError,
			Queue: p.Queue, MaxDelay: p.MaxDelay},
		header:    h,
		policyOpt: header("ratelimit-policy", h),
	}
}

// limitFor returns the limit that applies to client under p.
func (p *policy) limitFor(c *client) limit {
	if !p.UsePlan {
		return p.fixed
	}
	if c != nil && c.Plan != "" {
		if l, ok := p.plans[c.Plan]; ok {
			return l
		}
	}
	return p.plans[""]
}

// matches reports whether every condition of p's match holds for a.
func (p *policy) matches(a *attrs) bool {
	m := &p.Match
	if m.PathPrefix != "" && !strings.HasPrefix(a.path, m.PathPrefix) {
		return false
	}
	if len(m.Methods) > 0 && !contains(m.Methods, a.method) {
		return false
	}
	if len(m.Hosts) > 0 && !hostMatches(m.Hosts, a.host) {
		return false
	}
	for k, v := range m.Context {
		if got, ok := a.context[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func hostMatches(hosts []string, host string) bool {
	for _, h := range hosts {
		if h == host {
			return true
		}
		if suffix, ok := strings.CutPrefix(h, "*"); ok && len(host) > len(suffix) && strings.HasSuffix(host, suffix) {
			return true
		}
	}
	return false
}

// partition builds p's partition key for a request, such as
// "orders:client:ada" or, for a composite key, "orders:client:ada:ip:10.0.0.7".
// A missing component is empty, so callers lacking it share one bucket
// ("orders:client:"); missing reports whether any component was missing.
func (p *policy) partition(a *attrs, c *client, hops int) (key string, missing bool) {
	if len(p.Key) == 0 {
		return p.prefix, false
	}
	var buf [128]byte // most keys fit: one allocation, for the string
	b := append(buf[:0], p.prefix...)
	for _, k := range p.Key {
		v := keyValue(k, a, c, hops)
		if v == "" {
			missing = true
		}
		b = append(b, ':')
		b = append(b, k.Kind...)
		if k.Name != "" {
			b = append(b, ':')
			b = appendEscaped(b, k.Name)
		}
		b = append(b, ':')
		b = appendEscaped(b, v)
	}
	return string(b), missing
}

func keyValue(k config.KeyPart, a *attrs, c *client, hops int) string {
	switch k.Kind {
	case config.KeyClient:
		if c != nil {
			return c.ID
		}
	case config.KeyIP:
		return identity.ClientIP(a.peer, a.headers["x-forwarded-for"], hops)
	case config.KeyHeader:
		return a.headers[k.Name]
	case config.KeyClaim:
		v, _ := a.claim(k.Name)
		return v
	case config.KeyPrincipal:
		return a.principal
	case config.KeyPath:
		return a.path
	}
	return ""
}

// appendEscaped appends v with the bytes that structure a key (':' between
// components, braces of the Redis hash tag, '%' itself) and non-printable
// bytes percent-encoded, so no value can forge another key. Values longer
// than maxKeyValue are replaced by "sha256." and their digest's first 16
// bytes in hex.
func appendEscaped(b []byte, v string) []byte {
	if len(v) > maxKeyValue {
		sum := sha256.Sum256([]byte(v))
		b = append(b, "sha256."...)
		return hex.AppendEncode(b, sum[:16])
	}
	const digits = "0123456789ABCDEF"
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c <= ' ' || c >= 0x7f || c == '%' || c == ':' || c == '{' || c == '}' {
			b = append(b, '%', digits[c>>4], digits[c&15])
			continue
		}
		b = append(b, c)
	}
	return b
}
