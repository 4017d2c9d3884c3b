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
