package check

import (
	"runtime"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
)

// allocBytes is the heap allocated by fn.
func allocBytes(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A header_map with a name repeated n times is flattened in O(n): joining
// each repeat onto the previous join was O(n²), so a 4 MiB CheckRequest
// of one repeated header made the sidecar copy about 10¹¹ bytes.
func TestHeaderMapRepeatsAreLinear(t *testing.T) {
	build := func(n int) *authv3.AttributeContext_HttpRequest {
		h := &authv3.AttributeContext_HttpRequest{HeaderMap: &corev3.HeaderMap{}}
		for i := 0; i < n; i++ {
			h.HeaderMap.Headers = append(h.HeaderMap.Headers, &corev3.HeaderValue{Key: "x-a", Value: "v"}, &corev3.HeaderValue{Key: "X-A", RawValue: []byte("w")})
		}
		return h
	}
	small, large := build(5_000), build(20_000)
	var got map[string]string
	a := allocBytes(func() { got = flattenHeaderMap(small) })
	if want := strings.Repeat("v,w,", 5_000); got["x-a"] != want[:len(want)-1] || len(got) != 1 {
		t.Fatalf("flattened to %d names, x-a of %d bytes", len(got), len(got["x-a"]))
	}
	b := allocBytes(func() { flattenHeaderMap(large) })
	// Four times the input: linear work allocates about four times as
	// much, quadratic work sixteen.
	if b > 6*a {
		t.Fatalf("4× the repeats allocated %.1f× the bytes (%d vs %d): not linear", float64(b)/float64(a), b, a)
	}
}
