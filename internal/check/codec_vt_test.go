//go:build vtprotobuf

package check

import (
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
)

// With the vtprotobuf build tag (as `make` builds), responses take the
// generated marshaller: the fast path is compiled in, not just correct.
func TestCodecUsesGeneratedMarshaller(t *testing.T) {
	if _, ok := any(&authv3.CheckResponse{}).(vtMarshaler); !ok {
		t.Fatal("CheckResponse has no generated marshaller under the vtprotobuf tag")
	}
}
