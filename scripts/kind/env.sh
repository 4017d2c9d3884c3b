# shellcheck shell=bash disable=SC2034  # the variables are for the scripts that source this
# Settings shared by the kind scripts; each can be overridden from the
# environment. Sourced, not run.
CLUSTER="${CLUSTER:-extauthz}"
NAMESPACE="${NAMESPACE:-extauthz-demo}"
IMAGE="${IMAGE:-extauthz:dev}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
KUBECTL=(kubectl --context "kind-${CLUSTER}")

need() {
	local cmd
	for cmd in "$@"; do
		if ! command -v "$cmd" >/dev/null 2>&1; then
			echo "$(basename "$0"): $cmd is required but not installed" >&2
			exit 1
		fi
	done
}
