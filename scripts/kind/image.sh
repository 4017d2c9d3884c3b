#!/usr/bin/env bash
# Builds the extauthz image from the Dockerfile.
set -euo pipefail
# shellcheck source=scripts/kind/env.sh
source "$(dirname "$0")/env.sh"
need docker

version="$(git -C "$ROOT" describe --tags --always --dirty 2>/dev/null || echo dev)"
docker build --build-arg VERSION="$version" -t "$IMAGE" "$ROOT"
