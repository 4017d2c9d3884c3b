// Package caddy runs the shipped proxies/caddy/Caddyfile in a real Caddy,
// built from its Go module, in front of the real extauthz binary running
// proxies/extauthz.yaml, both with only their ports changed.
//
// It is a module of its own so that Caddy and its dependencies stay out of
// the product's go.mod: `make test-caddy` (part of `make test`) runs it.
// The first build compiles Caddy (a few minutes on two cores); later runs
// come from the build cache.
package caddy
