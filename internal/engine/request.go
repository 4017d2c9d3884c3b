package engine

import (
	"maps"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/extauthz/extauthz/internal/config"
)

// Request is what a decision reads of an HTTP request, whichever door it
// came in by. Every field may be empty: a request with no attributes at
// all is a request with no headers, no path and no peer.
type Request struct {
	Headers   map[string]string // lower-case names, as Envoy sends them
	Method    string
	Path      string // without the query string
	Host      string // lower case, without port or trailing dot (see NormalizeHost)
	Peer      string // source IP as the proxy saw it
	Principal string // the peer's identity under mTLS (a SPIFFE id)
	Context   map[string]string
	// JWT holds the payloads Envoy's jwt_authn filter verified, one per
	// provider under its payload_in_metadata name; nil without.
	JWT *structpb.Struct
	// Metadata is the dynamic metadata earlier filters set, by filter
	// namespace (Envoy's metadata_context.filter_metadata); nil without.
	// A cost may be read from it.
	Metadata map[string]*structpb.Struct

	payloads []*structpb.Struct // JWT's payloads in name order; set by Claim
	sorted   bool               // payloads is set
}

// TrimPath returns path without its query string or fragment.
func TrimPath(path string) string {
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		return path[:i]
	}
	return path
}

// NormalizeHost returns host as policies match it: lower case, without
// port or trailing dots (config.NormalizeHost). A door passes every
// request's host through it.
func NormalizeHost(host string) string { return config.NormalizeHost(host) }

// claim returns a JWT claim verified by jwt_authn. The namespace holds one
// payload per provider, each under the name set by payload_in_metadata; the
// claim is looked up in each payload in name order, then at the top level.
// Strings, numbers and booleans are claims; objects and lists are not.
// The payloads are sorted once per request, however many claims are read.
func (a *Request) claim(name string) (string, bool) {
	return scalar(a.claimValue(name))
}

// claimValue is the claim's value as jwt_authn verified it (see claim):
// the first scalar found; else the first value found that is not one (an
// object or a list, which a caller may report as malformed); nil when no
// payload holds the name.
func (a *Request) claimValue(name string) *structpb.Value {
	if a.JWT == nil {
		return nil
	}
	fields := a.JWT.GetFields()
	if !a.sorted {
		for _, k := range slices.Sorted(maps.Keys(fields)) {
			if payload := fields[k].GetStructValue(); payload != nil {
				a.payloads = append(a.payloads, payload)
			}
		}
		a.sorted = true
	}
	var other *structpb.Value
	for _, payload := range a.payloads {
		v := payload.GetFields()[name]
		if isScalar(v) {
			return v
		}
		if other == nil {
			other = v
		}
	}
	if v := fields[name]; isScalar(v) || other == nil {
		return v
	}
	return other
}

// isScalar reports whether v is a claim: a non-empty string, a number or
// a boolean.
func isScalar(v *structpb.Value) bool {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return k.StringValue != ""
	case *structpb.Value_NumberValue, *structpb.Value_BoolValue:
		return true
	}
	return false
}

func scalar(v *structpb.Value) (string, bool) {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return k.StringValue, k.StringValue != ""
	case *structpb.Value_NumberValue:
		return strconv.FormatFloat(k.NumberValue, 'f', -1, 64), true
	case *structpb.Value_BoolValue:
		return strconv.FormatBool(k.BoolValue), true
	}
	return "", false
}
