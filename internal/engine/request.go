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
	if a.JWT == nil {
		return "", false
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
	for _, payload := range a.payloads {
		if v, ok := scalar(payload.GetFields()[name]); ok {
			return v, true
		}
	}
	return scalar(fields[name])
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
