// Package sidecar is the running extauthz process as a library, so that
// cmd/extauthz only parses flags and the tests can run the process in
// theirs. New wires a configuration into the doors (internal/check,
// internal/httpauth, internal/rls), the limiters of every mode (Redis
// connected through redisstore.Open, redis.go), the metrics, tracing and
// the counters API; Start listens and serves; Run adds the signal loop;
// Reload re-reads the configuration files as one transaction over every
// door (each door prepares, then all commit: every door changes or none);
// Shutdown goes NOT_SERVING, drains the doors, then releases Redis and the
// spans, the admin listener last. The configuration watch is watch.go, the
// listeners' and Redis's TLS tls.go.
package sidecar
