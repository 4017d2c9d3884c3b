// Package redisstore counts in Redis: redis mode (every decision one
// atomic script call) and hybrid mode (replicas lease slices of a key's
// count and spend them locally), each behind Resilient, which decides a
// key by its limit's on_redis_error while Redis cannot.
//
// # The room's jobs, by file
//
//   - open.go: Open, the one place a replica's Redis side is assembled
//     (a Store, Peers, redis and hybrid modes each over its level source
//     and wrapped in Resilient) and released by one Close; client.go builds the go-redis clients (standalone,
//     Sentinel, Cluster) and the probe clients the breaker asks.
//   - store.go, scripts.go, calendar.go: the Redis account. The Store
//     runs the embedded Lua scripts (scripts/) with a per-call deadline,
//     the breaker's judgement (package breaker) and the metrics; the
//     scripts and their arguments and replies are the Go↔Lua contract
//     (each script's header names its KEYS and ARGV, its Go caller reads
//     its reply in one place: leaseOf, decisionOf).
//   - redis.go: redis mode (Redis), keeping the levels Redis reports in
//     the Table for a fallback to start from.
//   - hybrid.go, hybrid_lease.go, hybrid_fit.go, hybrid_level.go: hybrid
//     mode (Hybrid); its design note opens hybrid.go. A key's lease is a
//     value kept in its Table entry with its own verbs (hybrid_lease.go:
//     spend, expire, retire, give back); a take spends from it, waits
//     for another request's renewal or renews (Hybrid.Take,
//     takeMissLocked). Hybrid calls Redis through the leaser interface,
//     which the Store implements and a fake replaces in hybrid's unit
//     tests (hybrid_fake_test.go: no Redis, an injected clock).
//   - resilient.go: Resilient, the fallback to on_redis_error, starting
//     from the level the primary last recorded (LevelSource).
//   - table.go: the bounded per-key Table both modes keep their state in.
//   - peers.go: replica counting by heartbeat, and the Redis state's
//     Identity (epoch key, run_id), which tells a replica that Redis
//     forgot what it was told.
//   - inspect.go, resets.go: the counters API's reads and resets, a reset
//     reaching every replica by pub/sub (Resets, which the sidecar starts
//     once the counters API exists; its design note opens resets.go).
//   - metrics.go, reasons.go, failures.go: the collectors, the reasons
//     hybrid gives tokens back for, and how a failed call is classed.
//
// # Design notes
//
// Time is Redis's. Every script reads Redis TIME (scripts/clock.lua)
// unless a test injects a clock (StoreOptions.Clock), so replicas whose
// clocks disagree still decide on one clock. A replica's own clock
// bounds how long it spends a lease (erring short: it stops before Redis
// stops counting the lease) and computes a calendar window's bounds,
// among which Redis picks by its TIME (calendar.go).
//
// Read, decide and write are one atomic step: each decision is one
// script call, and a key's state lives under one hash tag
// ("rl:{partition}", Store.key), so every key a script touches is in one
// Redis Cluster slot. The store's own keys ("rl:_peers", "rl:_epoch")
// have no '{' after the prefix, so no policy's key can land on them.
//
// A failure is never an error to a door. A call that fails or stalls
// makes the breaker suspicious; a probe on a connection of its own
// confirms that Redis is down (the breaker's design note, package
// breaker); calls then fail at once with ErrStoreDown and Resilient
// answers from local.Fallback at the replica's share of the limit. A
// call that failed but may have run (mayHaveRun) leaves its key's share
// empty rather than fresh, and a lease reply that arrives after its
// decision stopped waiting is given back (Store.undoLate): a slow link
// costs the replicas admissions, never the bucket extra ones.
//
// Nothing here knows Envoy or the configuration's YAML: limits arrive as
// quota.Limit values and keys as partition strings.
package redisstore
