# extauthz tasks. `make test` is the one command CI runs (.ci/run).
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)

.PHONY: all build run test test-unit test-e2e-serial test-e2e-parallel test-packages lint fuzz redis-server redis-sentinel nginx test-caddy bench bench-compare bench-rlqs bench-fleet bench-micro clean image test-deploy test-chart kind-up kind-load kind-apply kind-smoke kind-down demo
IMAGE   ?= extauthz:dev

# go-control-plane ships generated marshallers (vtprotobuf) behind this
# build tag; with it the server encodes CheckResponses without reflection
# (see internal/check/codec.go). Builds without it, such as a plain
# `go run ./cmd/extauthz`, are correct and somewhat slower.
export GOFLAGS += -tags=vtprotobuf

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/extauthz ./cmd/extauthz

# Run the sidecar with the embedded default configuration (no Redis needed).
run:
	$(GO) run ./cmd/extauthz

# The whole suite: formatting, vet, tidiness, unit tests and the end-to-end
# tests that build the binary and start their own redis-server processes.
# First the end-to-end tests that must have the machine to themselves
# (tests/, serial(t, why): deliberate load, or milliseconds at the
# breaker's defaults); then everything else side by side, the end-to-end
# tests that share the machine (parallel(t)) among it. Each job's output
# appears whole when it ends.
#
# Beside the serial group runs only the idle lane, under Linux's
# SCHED_IDLE policy (chrt --idle; nice 19 where chrt is missing or
# refused): work that times nothing it could miss (fuzzing, a count of
# executions; the deployment files; the Caddy module, whose waits are 10
# to 30 s), taking the cycles the serial group leaves idle (it keeps the
# two cores about 70% busy: it mostly waits on failovers, breakers and
# windows). A SCHED_IDLE process runs only on a core no other process
# wants, and gives it up the moment one wakes. Its output follows the
# serial group's. docs/architecture.md, "Test lanes", has the times.
IDLE_LANE_LOG = $(CURDIR)/bin/idle-lane.log
IDLE = $(shell chrt --idle 0 true >/dev/null 2>&1 && echo chrt --idle 0 || echo nice -n 19)
test: redis-server redis-sentinel nginx lint
	@rm -f $(E2E_TIMES); mkdir -p bin
	@$(IDLE) $(MAKE) --no-print-directory -j -O test-deploy test-caddy fuzz > $(IDLE_LANE_LOG) 2>&1 & idle=$$!; \
	$(MAKE) --no-print-directory test-e2e-serial; serial=$$?; \
	wait $$idle; lane=$$?; cat $(IDLE_LANE_LOG); \
	if [ $$lane -ne 0 ]; then echo "the idle lane (fuzz, test-deploy, test-caddy) failed: exit $$lane"; fi; \
	[ $$serial -eq 0 ] && [ $$lane -eq 0 ]
	$(MAKE) --no-print-directory -j -O test-e2e-parallel test-packages
	@echo "the ten slowest end-to-end tests (seconds; a parallel one's in its slot):"
	@sort -k2 -rn $(E2E_TIMES) | head -10

# tests/ in two groups (tests/harness_test.go): EXTAUTHZ_E2E_GROUP picks
# one. Plain `go test ./tests/` runs both, the serial group first.
# Each test's time is appended to E2E_TIMES (tests/harness_test.go,
# TimesEnv).
E2E_TIMES ?= $(CURDIR)/bin/e2e-times.txt
test-e2e-serial:
	@mkdir -p $(dir $(E2E_TIMES))
	EXTAUTHZ_E2E_GROUP=serial EXTAUTHZ_E2E_TIMES=$(E2E_TIMES) $(GO) test -race -count=1 -timeout 20m ./tests/
test-e2e-parallel:
	@mkdir -p $(dir $(E2E_TIMES))
	EXTAUTHZ_E2E_GROUP=parallel EXTAUTHZ_E2E_TIMES=$(E2E_TIMES) $(GO) test -race -count=1 -timeout 20m ./tests/

# Every package's tests but tests/'s, with the race detector: unit tests,
# tests/quota against real redis-server, the tooling's own tests.
test-packages:
	$(GO) test -race -count=1 -timeout 20m $$($(GO) list ./... | grep -v '/tests$$')

# The fast lane: the product packages' own tests, in seconds, with no Redis
# and no binary to build (everything that needs them lives under tests/),
# and docs/'s check that every relative link and anchor resolves.
test-unit:
	$(GO) test -count=1 ./cmd/... ./internal/... ./docs

# Every native fuzz target under internal/, each for FUZZTIME (go test
# takes one -fuzz target per run). Failing inputs land in the package's
# testdata/fuzz/, where plain `go test` replays them. The default is a
# count of executions, not a duration: Go 1.26's fuzz coordinator can fail
# a target with a bare "context deadline exceeded" when a duration expires
# while a worker is mid-execution (golang/go#75804, fixed in Go 1.27), and
# it did here once in a loaded run. For long runs: make fuzz FUZZTIME=10m.
FUZZTIME ?= 5000x
fuzz:
	@set -e; grep -ro --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*' internal | sort -u | \
	while IFS=: read -r file fn; do \
		echo "fuzz: $${fn#func } in ./$$(dirname $$file) for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$${fn#func }\$$" -fuzztime $(FUZZTIME) ./$$(dirname $$file); \
	done

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) mod tidy -diff
	cd tests/deploy && $(GO) mod tidy -diff
	cd tests/caddy && $(GO) mod tidy -diff
	cd tools/bench && GOFLAGS=-buildvcs=false $(GO) mod tidy -diff

# Tests start redis-server themselves; install it where missing (Debian).
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
		echo "redis-server not found: installing it (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; }

# The Sentinel tests start redis-sentinel processes beside redis-server;
# Debian ships the binary in a package of its own.
redis-sentinel: redis-server
	@command -v redis-sentinel >/dev/null 2>&1 || { \
		echo "redis-sentinel not found: installing it (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-sentinel; }

# tests/nginx_test.go runs the shipped proxies/nginx config in a real nginx
# with the auth_request module: Debian's nginx package has it built in
# (nginx-light only adds the echo module to it). Installed where missing.
nginx:
	@{ command -v nginx || ls /usr/sbin/nginx; } >/dev/null 2>&1 || { \
		echo "nginx not found: installing it (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx; }
	@{ nginx -V 2>&1 || /usr/sbin/nginx -V 2>&1; } | grep -q -- --with-http_auth_request_module || { \
		echo "nginx lacks the auth_request module (nginx -V); install Debian's nginx package"; exit 1; }

# One table from one run: Check over gRPC for a no-op ceiling and the local,
# hybrid and redis modes, each driven by ghz (pinned in tools/bench) and by
# the in-process load generator, with the server's CPU per decision beside
# throughput and p50/p99; the HTTP door; the rate limit service; the key
# distributions in steady state (each warmed up for two lease lifetimes:
# BENCHFLAGS='-warmup 10s' for a smoke run). Then bench-compare, then the
# fleet table (bench-fleet), one after the other so none measures another's
# load; the bench fails if any missed a target. Record results in
# docs/benchmarks.md. About 30 minutes.
BENCHFLAGS ?=
bench: redis-server
	@status=0; \
	$(GO) run ./tests/bench $(BENCHFLAGS) || status=1; \
	$(MAKE) --no-print-directory bench-compare || status=1; \
	$(MAKE) --no-print-directory bench-fleet || status=1; \
	exit $$status

# extauthz in redis mode against envoyproxy/ratelimit, built at the version
# pinned in tools/bench through the Go module proxy (never vendored), each
# with a redis-server of its own, one fixed-window descriptor, driven by
# ghz: CPU per decision (process + its Redis). Skipped, and failed, with a
# message where it cannot be built.
bench-compare: redis-server
	$(GO) run ./tests/bench -compare

# The network-fault matrix (docs/reliability.md, "Network faults"):
# toxiproxy, pinned in tools/bench and built from the module proxy, between
# three replicas and Redis for every fault, redis mode beside hybrid, and
# envoyproxy/ratelimit (built at tools/bench's pin) behind the same toxics;
# prints the table. `make test` runs the short faults only. Also every
# Sentinel failover that loses writes (redis mode beside hybrid, and beside
# hybrid with redis.wait_replicas) and what WAIT costs (docs/reliability.md,
# "A failover that loses writes"), and Redis evicting keys under maxmemory
# (docs/reliability.md, "When Redis forgets"). Minutes.
.PHONY: test-faults
test-faults: redis-server
	$(GO) test -v -count=1 -timeout 30m -run 'TestNetworkFaults|TestWindowUnderNetworkFaults|TestWindowFaultJustBeforeATurn|TestForgetFlushWhileLeasesAreHeld|TestForgetRestoredFromOlderRDB|TestClusterFailoverLosesWrites|TestAnchorUnderNetworkFaults|TestNetworkFaultsOnOneClusterMaster|TestSentinelFailoverLosesWrites|TestWaitAtLostFailover|TestWaitCostHealthyReplication' ./tests/ -args -faults.full

# Fleets of 10, 100 and 1,000 simulated sidecars against a standalone Redis
# and a three-master Cluster, in redis and hybrid mode: Redis commands, CPU,
# connections, memory per key, call latency, heartbeat load. Record results
# in docs/capacity.md. About ten minutes.
bench-fleet: redis-server
	$(GO) run ./tests/benchfleet

# In-process microbenchmarks (ns/op, allocs/op); the hybrid slice's needs
# a redis-server to lease from.
bench-micro: redis-server
	$(GO) test -run '^$$' -bench . -benchtime 2s ./internal/... ./tests/quota

# The soak (docs/reliability.md#soak): three replicas of the real binary,
# hybrid, against one redis-server for 30 minutes at a fixed 1,000 calls/s
# with a million churning keys an hour, SIGHUP every 30 s, Redis restarted
# empty every 5 minutes and a replica every 10; fails unless every replica's
# memory, goroutines and files and Redis's memory are flat over the last
# 10 minutes, nothing is lost and the hot keys' oracle holds. Writes
# docs/soak.svg. Not part of `make test`. A smoke run, everything scaled to
# its length: make soak SOAKFLAGS=-duration=3m
.PHONY: soak
SOAKFLAGS ?=
soak: redis-server build
	$(GO) run ./tests/soak -bin bin/extauthz $(SOAKFLAGS)

# Envoy's rate limit quota service: 10 simulated Envoys × 1,000 buckets
# against one hybrid sidecar, beside Check on the same tenants: CPU and
# Redis calls per 1,000 admitted requests (docs/rlqs.md). About a minute.
bench-rlqs: redis-server
	$(GO) run ./tests/bench -rlqs

# Deployment files against their real schemas; needs no Docker or cluster.
# tests/deploy is a module of its own, so Kubernetes and Istio types stay out
# of the product's dependencies.
test-deploy:
	cd tests/deploy && $(GO) vet ./... && $(GO) test -count=1 ./...

# proxies/caddy/Caddyfile in a real Caddy, built from its Go module in a
# module of its own (tests/caddy), so Caddy stays out of the product's
# dependencies. The first run compiles Caddy: minutes on two cores.
test-caddy:
	cd tests/caddy && $(GO) vet ./... && $(GO) test -count=1 ./...

# The Helm chart alone: lint and render every values combination, the
# alerts' unit tests, the dashboard's queries against the binary's metrics.
test-chart:
	cd tests/deploy && $(GO) test -count=1 -run 'Chart|Alert|Dashboard|SharedLayoutRules' .

# The whole story in one command: a redis-server and three replicas of the
# real binary on loopback, the seed scenario beside every algorithm, and the
# boundary burst replayed with injected time. Needs redis-server on PATH
# (`make redis-server` installs it).
demo: build
	$(GO) run ./tests/demo -bin bin/extauthz

# Container image (Docker with BuildKit).
image:
	docker build --build-arg VERSION=$(VERSION) -t $(IMAGE) .

# A local kind cluster running k8s/sidecar (needs Docker, kind, kubectl).
kind-up:
	scripts/kind/up.sh
kind-load:
	IMAGE=$(IMAGE) scripts/kind/load.sh
kind-apply:
	scripts/kind/apply.sh
kind-smoke:
	scripts/kind/smoke.sh
kind-down:
	scripts/kind/down.sh

clean:
	rm -rf bin
