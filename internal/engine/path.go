package engine

import (
	"path"
	"strings"
)

// NormalizePath returns the path of a request-target (the query and
// fragment dropped) the way Envoy's normalize_path and merge_slashes
// leave it: percent-encoded unreserved characters decoded, dot segments
// removed, repeated slashes merged, a trailing slash kept. nginx and
// forward-auth proxies send the request-target as the client wrote it
// ($request_uri), and Envoy's :path is as its connection manager left it
// (Istio's default merges no slashes), so without this /%6Frders and
// //orders would pass a policy on /orders while the proxy routes them
// there. An encoded slash (%2F) is a slash here, as nginx's $uri and the
// shipped Envoy configurations (path_with_escaped_slashes_action:
// UNESCAPE_AND_REDIRECT) read it: /x/..%2Forders is /orders.
func NormalizePath(target string) string {
	p := decodeUnreserved(TrimPath(target))
	if p == "" {
		return "/"
	}
	if isClean(p) {
		return p // the common case, without the allocation path.Clean's caller makes below
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
// RFC 3986 unreserved characters (letters, digits, - . _ ~) and the slash,
// and upper-cases the hex digits of the others, which stay encoded. A '%' that starts no
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
		if unreserved(v) || v == '/' {
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

// isClean reports whether p is rooted and has no empty or dot segments:
// NormalizePath would return it unchanged.
func isClean(p string) bool {
	return p[0] == '/' && !strings.Contains(p, "//") && !strings.Contains(p, "/./") && !strings.Contains(p, "/../") &&
		!strings.HasSuffix(p, "/.") && !strings.HasSuffix(p, "/..")
}
