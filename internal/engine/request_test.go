package engine

import (
	"fmt"
	"runtime"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"
)

// allocBytes is the heap allocated by fn.
func allocBytes(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A request's claims are looked up with the jwt_authn payloads sorted once,
// not once per claim: with many top-level entries, eight claim key parts
// cost about what one does.
func TestClaimPayloadsSortedOnce(t *testing.T) {
	md := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i := 0; i < 20_000; i++ {
		md.Fields[fmt.Sprintf("junk%05d", i)] = structpb.NewStringValue("x")
	}
	md.Fields["payload"] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"c1": structpb.NewStringValue("v")}})
	lookups := func(n int) func() {
		return func() {
			a := Request{JWT: md}
			for i := 0; i < n; i++ {
				if v, ok := a.claim("c1"); !ok || v != "v" {
					t.Fatalf("claim c1 = %q, %v", v, ok)
				}
			}
		}
	}
	one, eight := allocBytes(lookups(1)), allocBytes(lookups(8))
	if eight > 2*one {
		t.Fatalf("eight claim lookups allocated %.1f× what one does (%d vs %d)", float64(eight)/float64(one), eight, one)
	}
}
