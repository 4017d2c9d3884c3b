// Package identity turns verified request attributes into caller identities:
// API keys matched by SHA-256 digest, bearer credentials, and the client IP
// taken from x-forwarded-for behind a known number of trusted proxies.
package identity

import (
	"crypto/sha256"
	"net/netip"
	"strings"
)

// Keyring finds the holder of an API key, a *C of the caller's choosing.
// Keys are never held in the clear: the presented key is hashed and the
// digest looked up. Safe for concurrent use once built.
type Keyring[C any] struct {
	byDigest map[[32]byte]*C
}

// NewKeyring returns an empty keyring sized for n keys.
func NewKeyring[C any](n int) *Keyring[C] {
	return &Keyring[C]{byDigest: make(map[[32]byte]*C, n)}
}

// Add registers c as the holder of the key that hashes to digest.
func (k *Keyring[C]) Add(digest [32]byte, c *C) {
	k.byDigest[digest] = c
}

// Len returns the number of known keys.
func (k *Keyring[C]) Len() int { return len(k.byDigest) }

// MaxKeyLen is the longest API key Lookup accepts, in bytes. Real keys are
// tens of bytes; a longer value is refused before it is hashed, so a caller
// cannot make every request hash megabytes.
const MaxKeyLen = 1024

// Lookup returns the holder of key, or nil. The map lookup compares
// digests, not keys, so its timing reveals nothing useful about a key.
// A key longer than MaxKeyLen has no holder.
func (k *Keyring[C]) Lookup(key string) *C {
	if len(key) > MaxKeyLen {
		return nil
	}
	return k.byDigest[sha256.Sum256([]byte(key))]
}

// Bearer returns the credential of an RFC 6750 "Bearer" authorization
// header value, and whether there was one. The scheme is case-insensitive.
func Bearer(authorization string) (string, bool) {
	const scheme = "bearer"
	if len(authorization) <= len(scheme) || !strings.EqualFold(authorization[:len(scheme)], scheme) {
		return "", false
	}
	rest := authorization[len(scheme):]
	if rest[0] != ' ' && rest[0] != '\t' {
		return "", false
	}
	cred := strings.TrimLeft(rest, " \t")
	cred = strings.TrimRight(cred, " \t")
	if cred == "" || strings.ContainsAny(cred, " \t") {
		return "", false
	}
	return cred, true
}

// IPRule says how a request's client address becomes a partition key
// value. The zero value keys by the whole peer address.
type IPRule struct {
	// TrustedHops is ClientIP's hops: x-forwarded-for entries appended by
	// proxies the operator trusts.
	TrustedHops int
	// IPv4Prefix and IPv6Prefix are the leading bits of an address kept:
	// callers within one such network share a key. 0 keeps the whole
	// address.
	IPv4Prefix, IPv6Prefix int
}

// Key returns the client's address (ClientIP) as r keys it: the address
// itself when its prefix is the whole address ("10.0.0.7"), else its
// network in CIDR notation ("2001:db8:1:2::/64"). It returns "" when no
// address is known.
func (r IPRule) Key(peer, xff string) string {
	var buf [64]byte
	return string(r.AppendKey(buf[:0], peer, xff))
}

// AppendKey appends Key(peer, xff) to b, without allocating when b has
// room.
func (r IPRule) AppendKey(b []byte, peer, xff string) []byte {
	a, ok := ClientAddr(peer, xff, r.TrustedHops)
	if !ok {
		return b
	}
	bits := r.IPv6Prefix
	if a.Is4() {
		bits = r.IPv4Prefix
	}
	if bits <= 0 || bits >= a.BitLen() {
		return a.AppendTo(b)
	}
	p, err := a.Prefix(bits)
	if err != nil {
		return a.AppendTo(b)
	}
	return p.AppendTo(b)
}

// ClientIP returns the caller's address in canonical form. With hops == 0
// it is the peer address Envoy saw. With hops > 0 it is the x-forwarded-for
// entry that many places from the right: the address the outermost trusted
// proxy received the request from. When the header has fewer entries or the
// entry is not an IP, the peer address is used, never a value the client
// could have chosen. It returns "" when no address is known.
func ClientIP(peer, xff string, hops int) string {
	if a, ok := ClientAddr(peer, xff, hops); ok {
		return a.String()
	}
	return ""
}

// ClientAddr is ClientIP as an address, for matching against networks
// without formatting it; false when no address is known.
func ClientAddr(peer, xff string, hops int) (netip.Addr, bool) {
	if hops > 0 && xff != "" {
		if a, ok := nthFromRight(xff, hops); ok {
			return a, true
		}
	}
	return parseIP(peer)
}

func nthFromRight(xff string, n int) (netip.Addr, bool) {
	end := len(xff)
	for i := 1; ; i++ {
		start := strings.LastIndexByte(xff[:end], ',') + 1
		if i == n {
			return parseIP(strings.TrimSpace(xff[start:end]))
		}
		if start == 0 {
			return netip.Addr{}, false
		}
		end = start - 1
	}
}

// parseIP reads an address, with or without a port, as the caller's: an
// IPv4-mapped IPv6 address is the IPv4 address, and a zone is dropped.
func parseIP(s string) (netip.Addr, bool) {
	if s == "" {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		// x-forwarded-for entries sometimes carry a port.
		ap, err2 := netip.ParseAddrPort(s)
		if err2 != nil {
			return netip.Addr{}, false
		}
		a = ap.Addr()
	}
	return a.Unmap().WithZone(""), true
}
