#!/usr/bin/env bash
# Smoke test through Envoy on the kind cluster: health checks pass without
# a key, an unknown key is a 401, and the demo key (plan free, 5 a minute)
# is allowed with RateLimit headers until a 429 arrives with Retry-After.
set -euo pipefail
# shellcheck source=scripts/kind/env.sh
source "$(dirname "$0")/env.sh"
need curl

URL="${URL:-http://127.0.0.1:8080}"
KEY="${KEY:-key-demo-123}"
fail() { echo "smoke: FAIL: $*" >&2; exit 1; }

# status METHOD PATH [curl args...]: prints the status code; headers go to
# $headers.
headers="$(mktemp)"
trap 'rm -f "$headers"' EXIT
status() {
	local method="$1" path="$2"
	shift 2
	curl -s -o /dev/null -D "$headers" -w '%{http_code}' -X "$method" "$@" "$URL$path"
}

for _ in 1 2 3 4 5 6 7 8; do
	code="$(status GET /healthz)"
	[ "$code" = 200 ] || fail "GET /healthz: $code, want 200 (ext_authz is disabled on it)"
done
echo "smoke: /healthz: 200 eight times, no key, no quota spent"

code="$(status GET / -H 'x-api-key: not-a-key')"
[ "$code" = 401 ] || fail "unknown key: $code, want 401"
echo "smoke: unknown key: 401"

for i in $(seq 1 30); do
	code="$(status GET / -H "x-api-key: $KEY")"
	case "$code" in
	200)
		grep -qi '^ratelimit-policy:' "$headers" || fail "200 without RateLimit-Policy"
		grep -qi '^ratelimit:' "$headers" || fail "200 without RateLimit"
		echo "smoke: request $i: 200 $(grep -i '^ratelimit:' "$headers" | tr -d '\r')"
		;;
	429)
		echo "smoke: request $i: 429"
		tr -d '\r' <"$headers" | grep -iE '^(retry-after|ratelimit-policy|ratelimit|content-type):' | sed 's/^/  /'
		grep -qi '^retry-after:' "$headers" || fail "429 without Retry-After"
		grep -qi '^ratelimit:' "$headers" || fail "429 without RateLimit"
		grep -qi '^content-type: application/problem+json' "$headers" || fail "429 body is not problem+json"
		echo "smoke: PASS"
		exit 0
		;;
	*) fail "request $i: status $code" ;;
	esac
done
fail "no 429 after 30 requests with a 5-a-minute key"
