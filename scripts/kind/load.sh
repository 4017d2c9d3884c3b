#!/usr/bin/env bash
# Builds the image and copies it into every node of the kind cluster, so
# pods start from it without a registry (imagePullPolicy: IfNotPresent).
set -euo pipefail
# shellcheck source=scripts/kind/env.sh
source "$(dirname "$0")/env.sh"
need kind docker

"$(dirname "$0")/image.sh"
kind load docker-image "$IMAGE" --name "$CLUSTER"
