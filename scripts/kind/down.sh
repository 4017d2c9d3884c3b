#!/usr/bin/env bash
# Deletes the kind cluster and everything in it.
set -euo pipefail
# shellcheck source=scripts/kind/env.sh
source "$(dirname "$0")/env.sh"
need kind

kind delete cluster --name "$CLUSTER"
