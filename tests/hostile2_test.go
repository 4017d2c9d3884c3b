package tests

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

// The second round of hostile input (issue 15): each test is one way a
// caller or a configuration bent a limit, run against the real binary.

// A value over 128 bytes is keyed by a digest that no value sent verbatim
// can spell: the digest's text as a header value is a bucket of its own.
func TestLongValueDigestCannotBeSentVerbatim(t *testing.T) {
	s := startSidecar(t, `
policies:
  - {name: tenant, key: ["header:x-tenant"], limit: 1, window: 1h}
`)
	long := strings.Repeat("t", 200)
	tenant := func(v string) int {
		return httpStatus(s.check(envoyRequest{headers: [][2]string{{"x-tenant", v}}}.build()))
	}
	if got := tenant(long); got != 200 {
		t.Fatalf("the long value's first request: %d", got)
	}
	if got := tenant(long); got != 429 {
		t.Fatalf("the long value's second request: %d, want 429 (limit 1)", got)
	}
	// The digest as round one spelled it, and that text behind a '%'.
	sum := sha256.Sum256([]byte(long))
	for _, forged := range []string{"sha256." + hex.EncodeToString(sum[:16]), "%sha256." + hex.EncodeToString(sum[:16])} {
		if got := tenant(forged); got != 200 {
			t.Fatalf("x-tenant %q: %d; it shares the bucket of the 200-byte value", forged, got)
		}
	}
}
