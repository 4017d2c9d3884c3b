package check

import (
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/proto"
)

// The generated marshaller and the standard one produce the same message,
// for every kind of answer the server gives.
func TestCodecMatchesStandardMarshal(t *testing.T) {
	f := newFixture(t, ordersYAML+"  - {name: tiny, match: {path_prefix: /tiny}, limit: 1, window: 1h}\n")
	var responses []*authv3.CheckResponse
	for _, spec := range []RequestSpec{
		{Method: "POST", Path: "/orders", Headers: map[string]string{"x-api-key": "key-ada"}},
		{Method: "POST", Path: "/orders", Headers: map[string]string{"x-api-key": "wrong"}},
		{Path: "/tiny"}, {Path: "/tiny"},
		{Path: "/", Headers: map[string]string{ClientIDHeader: "forged"}},
	} {
		responses = append(responses, f.check(spec))
	}
	c := newCodec()
	for i, resp := range responses {
		data, err := c.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		got := &authv3.CheckResponse{}
		if err := proto.Unmarshal(data.Materialize(), got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, resp) {
			t.Fatalf("response %d: the codec's bytes decode to\n%v\nwant\n%v", i, got, resp)
		}
		std, _ := proto.Marshal(resp)
		if len(std) != data.Len() {
			t.Fatalf("response %d: %d bytes, the standard marshaller makes %d", i, data.Len(), len(std))
		}
	}
	// Requests, which have no generated marshaller, go the standard way.
	req := NewRequest(RequestSpec{Method: "GET", Path: "/"})
	data, err := c.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	back := &authv3.CheckRequest{}
	if err := c.Unmarshal(data, back); err != nil || !proto.Equal(back, req) {
		t.Fatalf("request round trip: %v", err)
	}
}
