# extauthz tasks. `make test` is the one command CI runs (.ci/run).
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)

.PHONY: all build run test unit e2e lint redis-server bench clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/extauthz ./cmd/extauthz

# Run the sidecar with the embedded default configuration (no Redis needed).
run:
	$(GO) run ./cmd/extauthz

# The whole suite: formatting, vet, unit tests and the end-to-end tests that
# build the binary and start their own redis-server processes.
test: redis-server lint
	$(GO) test -race -count=1 -timeout 20m ./...

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# Tests start redis-server themselves; install it where missing (Debian).
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
		echo "redis-server not found: installing it (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; }

clean:
	rm -rf bin
