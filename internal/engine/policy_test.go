package engine

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/quota/local"
)

// The composite key is bounded whatever the request carries: values up to
// maxKeyValue (128) bytes are escaped (at most tripling them), longer ones
// become a 39-byte digest. The worst case reaches the bound.
//
// The bound for the policy below, worked by hand: its name (64 bytes),
// then per key part ":kind[:name]:" (client 8, ip 4, header:x-a 12,
// header:x-b 12, claim:sub 11, principal 11, path 6, claim:tenant 14: 78)
// and a value of at most 3 × 128 = 384 bytes each (3072): 3214 bytes.
func TestPartitionKeyBound(t *testing.T) {
	cfg, err := config.Parse([]byte(`
clients:
  keys: [{id: ada, key: key-ada}]
policies:
  - name: p123456789-123456789-123456789-123456789-123456789-123456789-123
    key: [client, ip, "header:x-a", "header:x-b", "claim:sub", principal, path, "claim:tenant"]
    limit: 10
    window: 1m
`), "bound.yaml")
	if err != nil {
		t.Fatal(err)
	}
	table, _ := local.NewTable(10)
	e, err := Compile(cfg, Limiters{config.ModeLocal: local.New(table)}, NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	p := e.Policies()[0]
	const bound = 3214
	worst := strings.Repeat(":", maxKeyValue) // 3 bytes each once escaped
	for _, v := range []string{"", "a", worst, worst + ":", strings.Repeat("\xff", 64<<10), strings.Repeat("x", 4<<20)} {
		a := Request{
			Headers:   map[string]string{"x-a": v, "x-b": v},
			Path:      v,
			Peer:      "2001:db8::1",
			Principal: v,
			JWT: &structpb.Struct{Fields: map[string]*structpb.Value{"p": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				"sub": structpb.NewStringValue(v), "tenant": structpb.NewStringValue(v),
			}})}},
		}
		key, _ := p.partition(&a, &Client{ID: "ada"}, e.ip)
		if len(key) > bound {
			t.Fatalf("value of %d bytes: key of %d bytes exceeds the bound %d", len(v), len(key), bound)
		}
		// The client id (ada, 3 bytes) and the IP's /64 (2001%3Adb8%3A%3A/64,
		// 19 bytes) are not the request's to choose: 3214 − 381 − 365.
		if v == worst && len(key) != 2468 {
			t.Fatalf("worst case: key of %d bytes; the bound %d is not tight", len(key), bound)
		}
		if len(v) > maxKeyValue && len(key) > len(p.prefix)+8*(len(":claim:tenant:")+len(digestPrefix)+32) {
			t.Fatalf("value of %d bytes: key of %d bytes; long values should be digests", len(v), len(key))
		}
	}
}

// A value over maxKeyValue bytes is keyed by its digest; the digest's text
// sent verbatim, in either the old or the new spelling, keys a bucket of
// its own.
func TestDigestCannotBeSentVerbatim(t *testing.T) {
	long := strings.Repeat("t", maxKeyValue+1)
	digest := string(appendEscaped(nil, long))
	if !strings.HasPrefix(digest, digestPrefix) {
		t.Fatalf("long value keyed as %q", digest)
	}
	for _, v := range []string{digest, strings.TrimPrefix(digest, "%"), "%25" + digest[1:]} {
		if got := string(appendEscaped(nil, v)); got == digest {
			t.Fatalf("the value %q sent verbatim keys %q, the bucket of a %d-byte value", v, got, len(long))
		}
	}
}
