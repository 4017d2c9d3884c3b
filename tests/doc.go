// Package tests holds the end-to-end tests: they build the real extauthz
// binary, run it as separate processes (and, for Redis modes, real
// redis-server processes on reserved loopback ports), and drive it over gRPC
// with CheckRequests shaped as Envoy's ext_authz filter builds them. Each
// test runs in the serial or the parallel group (harness_test.go).
package tests
