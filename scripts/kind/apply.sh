#!/usr/bin/env bash
# Deploys Redis and the sidecar layout (k8s/redis, k8s/sidecar) into
# $NAMESPACE and waits until every pod is ready.
set -euo pipefail
# shellcheck source=scripts/kind/env.sh
source "$(dirname "$0")/env.sh"
need kubectl

"${KUBECTL[@]}" create namespace "$NAMESPACE" --dry-run=client -o yaml | "${KUBECTL[@]}" apply -f -
k=("${KUBECTL[@]}" -n "$NAMESPACE")
"${k[@]}" apply -f "$ROOT/k8s/redis/"
"${k[@]}" apply -f "$ROOT/k8s/sidecar/"
"${k[@]}" apply -f "$ROOT/scripts/kind/nodeport.yaml"
"${k[@]}" rollout status deployment/redis --timeout=180s
# A new image under the same tag needs new pods to be picked up.
"${k[@]}" rollout restart deployment/demo-api
"${k[@]}" rollout status deployment/demo-api --timeout=300s
"${k[@]}" get pods -o wide
