package config

import "strings"

// NormalizeHost returns host as Envoy's route matching compares it, with
// its ignore_port_in_host_matching and strip_trailing_host_dot options on:
// lower case, without a port, without trailing dots. "API.Example.com.:443"
// is "api.example.com". An IPv6 literal keeps its brackets: "[::1]:8080"
// is "[::1]". Policies' match.hosts and every request's host are normalised
// alike, so no spelling of a host escapes the policies that name it.
func NormalizeHost(host string) string {
	host = strings.ToLower(host) // no allocation when already lower case
	if strings.HasPrefix(host, "[") {
		if i := strings.IndexByte(host, ']'); i > 0 {
			return host[:i+1]
		}
		return host
	}
	if i := strings.LastIndexByte(host, ':'); i >= 0 && strings.IndexByte(host, ':') == i {
		host = host[:i]
	}
	return strings.TrimRight(host, ".")
}
