#!/usr/bin/env bash
# Creates the kind cluster from kind-cluster.yaml (once).
set -euo pipefail
# shellcheck source=scripts/kind/env.sh
source "$(dirname "$0")/env.sh"
need kind kubectl docker

if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
	echo "kind cluster $CLUSTER already exists"
else
	kind create cluster --name "$CLUSTER" --config "$ROOT/kind-cluster.yaml" --wait 120s
fi
"${KUBECTL[@]}" get nodes
