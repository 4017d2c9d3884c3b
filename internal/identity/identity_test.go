package identity

import (
	"crypto/sha256"
	"testing"
)

func TestBearer(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
		ok   bool
	}{
		{"Bearer abc", "abc", true},
		{"bearer abc", "abc", true},
		{"BEARER   abc  ", "abc", true},
		{"Bearer\tabc", "abc", true},
		{"Bearer", "", false},
		{"Bearer ", "", false},
		{"Bearerabc", "", false},
		{"Basic YWxhZGRpbjpvcGVuc2VzYW1l", "", false},
		{"Bearer a b", "", false},
		{"", "", false},
	} {
		got, ok := Bearer(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Bearer(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestClientIP(t *testing.T) {
	for _, tc := range []struct {
		peer, xff string
		hops      int
		want      string
	}{
		{"10.0.0.1", "", 0, "10.0.0.1"},
		{"10.0.0.1", "1.1.1.1", 0, "10.0.0.1"}, // hops 0: the header is not trusted
		{"10.0.0.1", "1.1.1.1, 2.2.2.2", 1, "2.2.2.2"},
		{"10.0.0.1", "1.1.1.1, 2.2.2.2", 2, "1.1.1.1"},
		{"10.0.0.1", "1.1.1.1,2.2.2.2", 2, "1.1.1.1"},
		{"10.0.0.1", "2.2.2.2", 2, "10.0.0.1"},        // too few entries: the peer, not a guess
		{"10.0.0.1", "junk, 2.2.2.2", 2, "10.0.0.1"},  // not an IP: the peer
		{"10.0.0.1", "1.1.1.1:4711, x", 2, "1.1.1.1"}, // entries may carry a port
		{"::ffff:10.0.0.1", "", 0, "10.0.0.1"},        // 4in6 unmapped
		{"fe80::1%eth0", "", 0, "fe80::1"},            // zone dropped
		{"10.0.0.1", "[2001:db8::1]:443", 1, "2001:db8::1"},
		{"", "", 0, ""},
		{"not-an-ip", "", 0, ""},
	} {
		if got := ClientIP(tc.peer, tc.xff, tc.hops); got != tc.want {
			t.Errorf("ClientIP(%q, %q, %d) = %q, want %q", tc.peer, tc.xff, tc.hops, got, tc.want)
		}
	}
}

func TestIPRuleKey(t *testing.T) {
	def := IPRule{IPv4Prefix: 32, IPv6Prefix: 64}
	for _, tc := range []struct {
		rule      IPRule
		peer, xff string
		want      string
	}{
		{def, "10.0.0.7", "", "10.0.0.7"},
		{def, "2001:db8:1:2::1", "", "2001:db8:1:2::/64"},
		{def, "2001:db8:1:2:dead:beef:0:1", "", "2001:db8:1:2::/64"},
		{def, "2001:db8:1:3::1", "", "2001:db8:1:3::/64"},
		{def, "::ffff:10.0.0.7", "", "10.0.0.7"}, // a mapped IPv4 caller is an IPv4 caller
		{def, "fe80::1%eth0", "", "fe80::/64"},
		{def, "", "", ""},
		{IPRule{IPv4Prefix: 24, IPv6Prefix: 48}, "10.0.0.7", "", "10.0.0.0/24"},
		{IPRule{IPv4Prefix: 24, IPv6Prefix: 48}, "2001:db8:1:2::1", "", "2001:db8:1::/48"},
		{IPRule{IPv4Prefix: 32, IPv6Prefix: 128}, "2001:db8:1:2::1", "", "2001:db8:1:2::1"},
		{IPRule{TrustedHops: 1, IPv4Prefix: 32, IPv6Prefix: 64}, "10.0.0.1", "2001:db8:9:9::5", "2001:db8:9:9::/64"},
		{IPRule{}, "2001:db8:1:2::1", "", "2001:db8:1:2::1"}, // the zero value keeps the address
	} {
		if got := tc.rule.Key(tc.peer, tc.xff); got != tc.want {
			t.Errorf("%+v.Key(%q, %q) = %q, want %q", tc.rule, tc.peer, tc.xff, got, tc.want)
		}
	}
}

func TestKeyring(t *testing.T) {
	type client struct{ ID, Plan string }
	k := NewKeyring[client](1)
	k.Add(sha256.Sum256([]byte("secret")), &client{ID: "ada", Plan: "free"})
	if c := k.Lookup("secret"); c == nil || c.ID != "ada" || c.Plan != "free" {
		t.Fatalf("Lookup(secret) = %+v", c)
	}
	if c := k.Lookup("secret "); c != nil {
		t.Fatalf("Lookup of a different key = %+v", c)
	}
	if k.Len() != 1 {
		t.Fatalf("Len = %d", k.Len())
	}
}
