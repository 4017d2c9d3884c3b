package httpauth

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path"
	"strings"

	"github.com/extauthz/extauthz/internal/engine"
)

// How each proxy tells the original request, chosen by the path the proxy
// is configured to call. The path, not a header, selects the convention:
// every proxy passes the client's own headers through to the auth request,
// so a header-chosen convention would let a client pick which headers
// describe its request (an X-Original-URI sent through Caddy, say).
const (
	// EnvoyPrefix is Envoy http_service's path_prefix: Envoy appends the
	// original path and sends the original method and Host.
	EnvoyPrefix = "/envoy"
	// NginxPath is where nginx's auth_request subrequest goes. nginx sends
	// it as GET, so the original method and URI come in the headers
	// http.method_header and http.uri_header name.
	NginxPath = "/nginx"
	// ForwardAuthPath is the forward-auth convention of Traefik's
	// forwardAuth and Caddy's forward_auth: X-Forwarded-Method, -Uri and
	// -Host (and -Proto, -For).
	ForwardAuthPath = "/forward-auth"
)

// convention is one proxy's way of telling the original request.
type convention uint8

const (
	envoy convention = iota
	nginx
	forwardAuth
)

// The forward-auth headers, in Go's canonical form.
const (
	forwardedMethod = "X-Forwarded-Method"
	forwardedURI    = "X-Forwarded-Uri"
	forwardedHost   = "X-Forwarded-Host"
)

// badRequest is an auth request the door cannot read: the proxy is
// misconfigured, so the answer names what to fix.
type badRequest struct {
	status int // 400 or 404
	detail string
}

// newRequest reads the original request that r describes into at, its
// headers into hm (empty). c holds the configured nginx header names in
// Go's canonical form and the headers decisions read.
func newRequest(r *http.Request, c *compiled, hm map[string]string, at *engine.Request) (convention, *badRequest) {
	// The escaped path is the request-target as sent (Go decodes Path).
	target := r.URL.EscapedPath()
	var conv convention
	switch {
	case target == EnvoyPrefix || strings.HasPrefix(target, EnvoyPrefix+"/"):
		conv = envoy
	case target == NginxPath:
		conv = nginx
	case target == ForwardAuthPath:
		conv = forwardAuth
	default:
		return 0, &badRequest{http.StatusNotFound, "No such endpoint: the HTTP door serves " +
			EnvoyPrefix + "/… (Envoy http_service, path_prefix " + EnvoyPrefix + "), " +
			NginxPath + " (nginx auth_request) and " + ForwardAuthPath + " (Traefik, Caddy)."}
	}

	at.Headers = c.headers(r.Header, hm)
	at.Peer = peerIP(r.RemoteAddr)
	switch conv {
	case envoy:
		// Envoy sends its :path, which its HTTP connection manager has
		// normalised (normalize_path, merge_slashes in envoy/), as the
		// gRPC door receives it.
		at.Method = r.Method
		at.Path = strings.TrimPrefix(target, EnvoyPrefix)
		if at.Path == "" {
			at.Path = "/"
		}
		at.Host = engine.NormalizeHost(r.Host)
	case nginx:
		uri, bad := single(r.Header, c.uriKey, c.uriName, "the original request URI: proxy_set_header %s $request_uri;")
		if bad != nil {
			return conv, bad
		}
		method, bad := single(r.Header, c.methodKey, c.methodName, "the original method: proxy_set_header %s $request_method;")
		if bad != nil {
			return conv, bad
		}
		at.Method = method
		host := r.Host // nginx passes $host with proxy_set_header Host $host
		if u, ok := absoluteURL(uri); ok {
			// ingress-nginx's auth-url sends X-Original-URL: the whole URL.
			host, uri = u.Host, u.EscapedPath()
		}
		at.Path = NormalizePath(uri)
		at.Host = engine.NormalizeHost(host)
	case forwardAuth:
		method, bad := single(r.Header, forwardedMethod, forwardedMethod, "the original method")
		if bad != nil {
			return conv, bad
		}
		uri, bad := single(r.Header, forwardedURI, forwardedURI, "the original request URI")
		if bad != nil {
			return conv, bad
		}
		host, bad := single(r.Header, forwardedHost, forwardedHost, "the original host")
		if bad != nil {
			return conv, bad
		}
		at.Method = method
		at.Path = NormalizePath(uri)
		at.Host = engine.NormalizeHost(host)
	}
	return conv, nil
}

// single returns the one value of the header whose canonical key is key
// (name is how messages spell it). None, or several (a client sent its
// own and the proxy added one rather than replacing it), is a
// misconfigured proxy: deciding on a guess could match the wrong
// policies. what says what the header carries; a %s in it stands for name.
func single(h http.Header, key, name, what string) (string, *badRequest) {
	vs := h[key]
	switch {
	case len(vs) == 1 && vs[0] != "":
		return vs[0], nil
	case len(vs) > 1:
		return "", &badRequest{http.StatusBadRequest, "Header " + name + " is repeated: the proxy must replace the client's, not add another."}
	}
	if strings.Contains(what, "%s") {
		what = fmt.Sprintf(what, name)
	}
	return "", &badRequest{http.StatusBadRequest, "Header " + name + " is missing: the proxy must send " + what + "."}
}

// absoluteURL parses an absolute http(s) URL.
func absoluteURL(s string) (*url.URL, bool) {
	if !strings.HasPrefix(s, "http://") && !strings.HasPrefix(s, "https://") {
		return nil, false
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return nil, false
	}
	return u, true
}

// peerIP is the IP of the proxy's connection: "" on a unix socket.
func peerIP(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return ""
	}
	return host
}

// NormalizePath returns the path of a request-target (the query and
// fragment dropped) the way Envoy's normalize_path and merge_slashes
// leave it: percent-encoded unreserved characters decoded, dot segments
// removed, repeated slashes merged, a trailing slash kept. nginx and
// forward-auth proxies send the request-target as the client wrote it
// ($request_uri), so without this /%6Frders and //orders would pass a
// policy on /orders while the proxy routes them there.
func NormalizePath(target string) string {
	p := decodeUnreserved(engine.TrimPath(target))
	if p == "" {
		return "/"
	}
	rooted := p[0] == '/'
	trailing := strings.HasSuffix(p, "/") || strings.HasSuffix(p, "/.") || strings.HasSuffix(p, "/..") || p == "." || p == ".."
	p = path.Clean(p)
	if !rooted {
		// A request-target is rooted; one that is not ("*", or a
		// misconfigured header) is matched as if it were.
		p = path.Clean("/" + p)
	}
	if trailing && p != "/" {
		p += "/"
	}
	return p
}

// decodeUnreserved decodes the percent-encoded octets that stand for
// RFC 3986 unreserved characters (letters, digits, - . _ ~), and
// upper-cases the hex digits of the others, which stay encoded (%2f and
// %2F alike: an encoded slash is not a separator). A '%' that starts no
// escape is itself encoded, %25, as a server that takes it literally
// reads it: otherwise decoding "%2%44" would make "%2D", an escape the
// client never sent, and normalising twice would differ from once.
func decodeUnreserved(s string) string {
	i := strings.IndexByte(s, '%')
	if i < 0 {
		return s
	}
	b := make([]byte, 0, len(s)+4)
	b = append(b, s[:i]...)
	for ; i < len(s); i++ {
		c := s[i]
		if c != '%' {
			b = append(b, c)
			continue
		}
		if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
			b = append(b, "%25"...)
			continue
		}
		v := unhex(s[i+1])<<4 | unhex(s[i+2])
		if unreserved(v) {
			b = append(b, v)
		} else {
			b = append(b, '%', upperHex(s[i+1]), upperHex(s[i+2]))
		}
		i += 2
	}
	return string(b)
}

func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

func upperHex(c byte) byte {
	if 'a' <= c && c <= 'f' {
		return c - 'a' + 'A'
	}
	return c
}
