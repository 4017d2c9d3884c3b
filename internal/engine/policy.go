package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/identity"
)

// maxKeyValue is the longest key component kept verbatim. Longer values
// (a 64 KiB header chosen as a key, say) are replaced by their SHA-256, so a
// partition key stays short whatever a request carries, and distinct values
// stay distinct. A component a request controls thus adds at most
// 3 × maxKeyValue bytes to a key (every byte percent-encoded); with
// config's limit of 8 key parts, at most 3 KiB, plus the policy's names.
const maxKeyValue = 128

// matches reports whether every condition of p's match holds for a;
// hops is ip_trusted_hops, for source_cidrs.
func (p *Policy) matches(a *Request, hops int) bool {
	return matchAll(&p.Match, a, hops)
}

// matchAll tests the conditions cheapest first. The conditions policies
// had before headers, claims, networks and not cost no allocation, and
// their order and cost are unchanged: the newer ones are tested only when
// configured.
func matchAll(m *config.Match, a *Request, hops int) bool {
	if m.PathPrefix != "" && !strings.HasPrefix(a.Path, m.PathPrefix) {
		return false
	}
	if len(m.Methods) > 0 && !contains(m.Methods, a.Method) {
		return false
	}
	if len(m.Hosts) > 0 && !hostMatches(m.Hosts, a.Host) {
		return false
	}
	for k, v := range m.Context {
		if got, ok := a.Context[k]; !ok || got != v {
			return false
		}
	}
	if len(m.Headers) > 0 || len(m.Claims) > 0 || len(m.SourceCIDRs) > 0 || m.Not != nil {
		return matchMore(m, a, hops)
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
func (p *Policy) partition(a *Request, c *Client, ip identity.IPRule) (key string, missing bool) {
	if len(p.Key) == 0 {
		return p.prefix, false
	}
	var buf [128]byte // most keys fit: one allocation, for the string
	b := append(buf[:0], p.prefix...)
	for _, k := range p.Key {
		b = appendKeyPart(b, k)
		if k.Kind == config.KeyIP {
			// Formatted on the stack, not into a string of its own.
			var ipBuf [64]byte
			ipb := ip.AppendKey(ipBuf[:0], a.Peer, a.Headers["x-forwarded-for"])
			b = appendEscapedBytes(b, ipb, 0)
			if len(ipb) == 0 {
				missing = true
			}
			continue
		}
		v := keyValue(k, a, c)
		if v == "" {
			missing = true
		}
		b = appendEscaped(b, v)
	}
	return string(b), missing
}

// keyValue is a key part's value, but for the ip part, which partition
// formats itself.
func keyValue(k config.KeyPart, a *Request, c *Client) string {
	switch k.Kind {
	case config.KeyClient:
		if c != nil {
			return c.ID
		}
	case config.KeyHeader:
		return a.Headers[k.Name]
	case config.KeyClaim:
		v, _ := a.claim(k.Name)
		return v
	case config.KeyPrincipal:
		return a.Principal
	case config.KeyPath:
		return a.Path
	}
	return ""
}

// appendKeyPart appends what names key part k in a partition key,
// ":kind:" or ":kind:name:", before its value: the one spelling Check's
// keys and a descriptor sharing a policy's bucket (PartitionFor) agree on.
func appendKeyPart(b []byte, k config.KeyPart) []byte {
	b = append(b, ':')
	b = append(b, k.Kind...)
	if k.Name != "" {
		b = append(b, ':')
		b = appendEscaped(b, k.Name)
	}
	return append(b, ':')
}

// digestPrefix starts the stand-in of a value longer than maxKeyValue. An
// escaped value holds '%' only as the start of "%XX" with XX two upper-case
// hex digits, never followed by 's': no value sent verbatim can spell a
// digest, and so none can share the bucket of a long value.
const digestPrefix = "%sha256."

// appendEscaped appends v with the bytes that structure a key (':' between
// components, braces of the Redis hash tag, '%' itself) and non-printable
// bytes percent-encoded, so no value can forge another key. Values longer
// than maxKeyValue are replaced by digestPrefix and their digest's first
// 16 bytes in hex.
func appendEscaped(b []byte, v string) []byte { return appendEscapedAlso(b, v, 0) }

// appendEscapedAlso is appendEscaped with one more byte, also,
// percent-encoded: a door whose keys are structured by another byte
// passes it (0: none more; it is escaped anyway).
func appendEscapedAlso(b []byte, v string, also byte) []byte {
	if len(v) > maxKeyValue {
		sum := sha256.Sum256([]byte(v))
		b = append(b, digestPrefix...)
		return hex.AppendEncode(b, sum[:16])
	}
	return appendEscapedBytes(b, v, also)
}

// appendEscapedBytes is appendEscapedAlso's escaping, for a value of at
// most maxKeyValue bytes.
func appendEscapedBytes[S string | []byte](b []byte, v S, also byte) []byte {
	const digits = "0123456789ABCDEF"
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c <= ' ' || c >= 0x7f || c == '%' || c == ':' || c == '{' || c == '}' || c == also {
			b = append(b, '%', digits[c>>4], digits[c&15])
			continue
		}
		b = append(b, c)
	}
	return b
}

// missingDetail is the 401 detail of a policy whose key a request lacks.
func missingDetail(p *Policy) string {
	parts := make([]string, len(p.Key))
	for i, k := range p.Key {
		parts[i] = k.String()
	}
	return fmt.Sprintf("Policy %s needs %s to identify the caller.", p.Name, strings.Join(parts, ", "))
}

// sortedPlans returns the plan names in order.
func sortedPlans(plans map[string]config.Plan) []string {
	return slices.Sorted(maps.Keys(plans))
}
