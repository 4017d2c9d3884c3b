package check

import (
	"bytes"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
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

// A CheckRequest that does not decode decodes as undecodable, each way it
// can fail; other messages keep their error.
func TestCodecMarksUndecodableCheckRequests(t *testing.T) {
	c := newCodec()
	valid, err := proto.Marshal(NewRequest(RequestSpec{Path: "/", Headers: map[string]string{"x-note": "PLACEHOLDER"}}))
	if err != nil {
		t.Fatal(err)
	}
	deep := &structpb.Struct{}
	for range 6000 {
		deep = &structpb.Struct{Fields: map[string]*structpb.Value{"a": structpb.NewStructValue(deep)}}
	}
	tooDeep, err := proto.Marshal(&authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"deep": deep}}}})
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{
		"invalid UTF-8":      bytes.Replace(valid, []byte("PLACEHOLDER"), []byte("\xff\xfeACEHOLDER"), 1),
		"nested 12,000 deep": tooDeep,
		"truncated":          valid[:len(valid)-3],
	} {
		req := &authv3.CheckRequest{}
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, req); err != nil || req.GetAttributes() != undecodable {
			t.Errorf("%s: error %v, attributes marked undecodable: %v", name, err, req.GetAttributes() == undecodable)
		}
	}
	deepStruct, err := proto.Marshal(deep)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(deepStruct)}, &structpb.Struct{}); err == nil {
		t.Error("a Struct that does not decode: no error")
	}
}
