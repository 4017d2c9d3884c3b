package config

import "testing"

func TestNormalizeHost(t *testing.T) {
	for in, want := range map[string]string{
		"api.example.com":      "api.example.com",
		"API.Example.COM":      "api.example.com",
		"api.example.com.":     "api.example.com",
		"api.example.com..":    "api.example.com",
		"API.EXAMPLE.COM.:443": "api.example.com",
		"api.example.com:8080": "api.example.com",
		"[2001:DB8::1]:443":    "[2001:db8::1]",
		"[::1]":                "[::1]",
		"2001:db8::1":          "2001:db8::1", // unbracketed: no port to drop
		"*.Example.com.":       "*.example.com",
		"":                     "",
		".":                    "",
		"10.0.0.1:80":          "10.0.0.1",
	} {
		if got := NormalizeHost(in); got != want {
			t.Errorf("NormalizeHost(%q) = %q, want %q", in, got, want)
		}
	}
}

// match.hosts are normalised as requests' hosts are.
func TestMatchHostsNormalised(t *testing.T) {
	c, err := Parse([]byte("policies:\n  - {name: p, limit: 1, window: 1m, match: {hosts: [API.Example.com., \"*.Example.org:443\"]}}\n"), "t")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Policies[0].Match.Hosts; len(got) != 2 || got[0] != "api.example.com" || got[1] != "*.example.org" {
		t.Fatalf("hosts = %q", got)
	}
	if _, err := Parse([]byte("policies:\n  - {name: p, limit: 1, window: 1m, match: {hosts: [\"...\"]}}\n"), "t"); err == nil {
		t.Fatal("a host of dots was accepted")
	}
}
