# syntax=docker/dockerfile:1
#
# extauthz container image: a static binary on distroless, running as an
# unprivileged user. Build it with `make image` or:
#
#   docker build -t extauthz:dev --build-arg VERSION=$(git describe --tags --always) .
#
# tests/deploy checks this file: the build stage must compile ./cmd/extauthz
# with CGO_ENABLED=0 (the test runs that very command), and the final stage
# must be non-root.

# Keep in step with the `go` line of go.mod (tests/deploy checks it).
ARG GO_VERSION=1.26.8

# The build stage runs on the builder's own platform and cross-compiles,
# so multi-arch builds (docker buildx --platform linux/amd64,linux/arm64)
# need no emulation.
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
# Modules first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# Set by BuildKit from --platform.
ARG TARGETOS TARGETARCH
ARG VERSION=dev
# CGO_ENABLED=0: a static binary, so the final image needs no libc.
# -trimpath: no build-machine paths in the binary. -s -w: no debug symbols.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -tags vtprotobuf -ldflags "-s -w -X main.version=${VERSION}" -o /out/extauthz ./cmd/extauthz

# distroless/static: CA certificates (for redis.tls) and tzdata, no shell,
# no package manager. The :nonroot tag runs as 65532:65532.
FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/extauthz /extauthz
# Envoy Gateway's rate-limit Deployment runs /bin/ratelimit with no
# arguments: under that name the binary reads envoyproxy/ratelimit's
# environment (docs/envoy-gateway.md), so changing the image is enough.
# A copy, not a link: distroless has no shell to make one, and COPY
# follows links.
COPY --from=build /out/extauthz /bin/ratelimit
# Numeric, so Kubernetes runAsNonRoot can verify it without reading /etc/passwd.
USER 65532:65532
# The image serves the configuration mounted here (k8s/ mounts a ConfigMap
# at /etc/extauthz) or the file -config names; without one it exits 1
# saying so. The embedded demo configuration accepts a published demo key:
# only a bare `extauthz serve` with neither -config nor $EXTAUTHZ_CONFIG
# (`go run ./cmd/extauthz` on a workstation) serves it, never the image.
ENV EXTAUTHZ_CONFIG=/etc/extauthz/extauthz.yaml
# 9001: gRPC Authorization/Check and grpc.health.v1. 9090: /metrics /healthz /readyz.
EXPOSE 9001 9090
ENTRYPOINT ["/extauthz"]
CMD ["serve"]
