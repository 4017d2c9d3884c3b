package identity

import (
	"crypto/sha256"
	"net/netip"
	"strings"
	"testing"
)

// FuzzBearer: Bearer never panics, and a credential it returns is a
// non-empty substring of the header with no spaces or tabs, found after a
// case-insensitive "Bearer" and whitespace.
func FuzzBearer(f *testing.F) {
	for _, s := range []string{
		"Bearer abc", "bearer abc", "BEARER   abc  ", "Bearer\tabc", "Bearer", "Bearer ",
		"Bearerabc", "Basic YWxhZGRpbjpvcGVuc2VzYW1l", "Bearer a b", "", "Bearer \t \t",
		"Bearer \x00\xff", "bEaReR\t\tk\t", "Bearer " + strings.Repeat("k", 2048),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		cred, ok := Bearer(in)
		if !ok {
			if cred != "" {
				t.Fatalf("Bearer(%q) = %q, false: a refusal must return no credential", in, cred)
			}
			return
		}
		if cred == "" || strings.ContainsAny(cred, " \t") {
			t.Fatalf("Bearer(%q) = %q: empty or has whitespace", in, cred)
		}
		i := strings.LastIndex(in, cred) // cred has no whitespace: its last occurrence is the one
		if i < 0 {
			t.Fatalf("Bearer(%q) = %q: not a substring of the input", in, cred)
		}
		if !strings.EqualFold(in[:6], "bearer") || strings.Trim(in[6:i], " \t") != "" || i == 6 {
			t.Fatalf("Bearer(%q) = %q: not preceded by the scheme and whitespace", in, cred)
		}
		if strings.Trim(in[i+len(cred):], " \t") != "" {
			t.Fatalf("Bearer(%q) = %q: something other than whitespace follows it", in, cred)
		}
	})
}

// FuzzClientIP: ClientIP never panics; it returns "" or a canonical IP
// (one that parses and prints as itself, with no zone and no 4in6
// mapping); with hops 0 it is the peer's address whatever x-forwarded-for
// says; with hops > 0 it is the hops-th entry from the right when that is
// an address, else the peer's, never another entry.
func FuzzClientIP(f *testing.F) {
	for _, s := range []struct {
		peer, xff string
		hops      int
	}{
		{"10.0.0.1", "", 0},
		{"10.0.0.1", "1.1.1.1", 0},
		{"10.0.0.1", "1.1.1.1, 2.2.2.2", 1},
		{"10.0.0.1", "1.1.1.1, 2.2.2.2", 2},
		{"10.0.0.1", "2.2.2.2", 5},
		{"10.0.0.1", "junk, 2.2.2.2", 2},
		{"10.0.0.1", "1.1.1.1:4711, x", 2},
		{"::ffff:10.0.0.1", "", 0},
		{"fe80::1%eth0", "fe80::2%lo, ::ffff:1.2.3.4", 1},
		{"10.0.0.1", "[2001:db8::1]:443", 1},
		{"", ",,,", 3},
		{"not-an-ip", "", 0},
		{"1.2.3.4", ",", 64},
		{"1.2.3.4", "[::ffff:1.2.3.4%x]:1", 1},
	} {
		f.Add(s.peer, s.xff, s.hops)
	}
	f.Fuzz(func(t *testing.T, peer, xff string, hops int) {
		if hops > 64 || hops < -64 {
			hops %= 65 // ip_trusted_hops is validated to 0..64
		}
		got := ClientIP(peer, xff, hops)
		if got != "" {
			a, err := netip.ParseAddr(got)
			if err != nil || a.String() != got || a.Zone() != "" || a.Is4In6() {
				t.Fatalf("ClientIP(%q, %q, %d) = %q: not a canonical address (%v)", peer, xff, hops, got, err)
			}
		}
		peerIP := ClientIP(peer, "", 0)
		if hops <= 0 {
			if got != peerIP {
				t.Fatalf("ClientIP(%q, %q, %d) = %q, want the peer's %q: with hops %d the header is not trusted", peer, xff, hops, got, peerIP, hops)
			}
			return
		}
		// The oracle: the hops-th comma-separated entry from the right,
		// when there is one and it is an address; the peer otherwise.
		want := peerIP
		if entries := strings.Split(xff, ","); hops <= len(entries) {
			if ip, ok := parseIP(strings.TrimSpace(entries[len(entries)-hops])); ok {
				want = ip.String()
			}
		}
		if got != want {
			t.Fatalf("ClientIP(%q, %q, %d) = %q, want %q", peer, xff, hops, got, want)
		}
	})
}

// FuzzIPRuleKey: the ip key is "" exactly when ClientIP is, and otherwise
// the client's address or the masked network of the configured length
// that holds it: no two keys for one network, and never a network that
// does not hold the client.
func FuzzIPRuleKey(f *testing.F) {
	f.Add("2001:db8:1:2::1", "", 0, 32, 64)
	f.Add("10.0.0.7", "", 0, 24, 64)
	f.Add("10.0.0.1", "2001:db8::1, junk", 2, 32, 1)
	f.Add("::ffff:1.2.3.4", "", 0, 1, 128)
	f.Fuzz(func(t *testing.T, peer, xff string, hops, v4, v6 int) {
		hops %= 65
		r := IPRule{TrustedHops: hops, IPv4Prefix: 1 + abs(v4)%32, IPv6Prefix: 1 + abs(v6)%128}
		ip, got := ClientIP(peer, xff, hops), r.Key(peer, xff)
		if (ip == "") != (got == "") {
			t.Fatalf("%+v.Key(%q, %q) = %q, ClientIP %q", r, peer, xff, got, ip)
		}
		if ip == "" {
			return
		}
		a := netip.MustParseAddr(ip)
		bits := r.IPv6Prefix
		if a.Is4() {
			bits = r.IPv4Prefix
		}
		want, _ := a.Prefix(bits)
		if bits == a.BitLen() {
			if got != ip {
				t.Fatalf("%+v.Key(%q, %q) = %q, want the address %q", r, peer, xff, got, ip)
			}
			return
		}
		if got != want.String() || !want.Contains(a) {
			t.Fatalf("%+v.Key(%q, %q) = %q, want %s", r, peer, xff, got, want)
		}
	})
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// A presented key longer than MaxKeyLen is never hashed or looked up.
func TestLookupRefusesLongKeys(t *testing.T) {
	type client struct{ ID string }
	long := strings.Repeat("k", MaxKeyLen+1)
	k := NewKeyring[client](2)
	k.Add(sha256.Sum256([]byte(long)), &client{ID: "long"})
	k.Add(sha256.Sum256([]byte(long[:MaxKeyLen])), &client{ID: "max"})
	if c := k.Lookup(long); c != nil {
		t.Fatalf("Lookup of a %d-byte key = %+v, want nil", len(long), c)
	}
	if c := k.Lookup(long[:MaxKeyLen]); c == nil || c.ID != "max" {
		t.Fatalf("Lookup of a %d-byte key = %+v, want max", MaxKeyLen, c)
	}
	if allocs := testing.AllocsPerRun(10, func() { k.Lookup(long) }); allocs != 0 {
		t.Fatalf("Lookup of a long key allocated %v times", allocs)
	}
}
