package engine

import (
	"strings"
	"testing"
)

// NormalizePath's output is what policies match: rooted, without a query,
// empty or dot segments, stable when normalised again, and with no
// encoded unreserved character or slash left to spell a prefix another way.
func FuzzNormalizePath(f *testing.F) {
	for _, s := range []string{"", "/", "/orders?x", "//a/./b/../c/", "/%6frders", "/%2e%2E/x", "*", "a/b", "/%", "/%4", "/%%41", "/a#b?c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out := NormalizePath(in)
		if !strings.HasPrefix(out, "/") || strings.ContainsAny(out, "?#") || strings.Contains(out, "//") {
			t.Fatalf("NormalizePath(%q) = %q", in, out)
		}
		for _, seg := range strings.Split(out, "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("NormalizePath(%q) = %q keeps a dot segment", in, out)
			}
		}
		if again := NormalizePath(out); again != out {
			t.Fatalf("NormalizePath(%q) = %q, but NormalizePath of that = %q", in, out, again)
		}
		for i := 0; i+2 < len(out); i++ {
			if out[i] == '%' && isHex(out[i+1]) && isHex(out[i+2]) && (unreserved(unhex(out[i+1])<<4|unhex(out[i+2])) || unhex(out[i+1])<<4|unhex(out[i+2]) == '/') {
				t.Fatalf("NormalizePath(%q) = %q leaves %s encoded", in, out, out[i:i+3])
			}
		}
	})
}

func TestNormalizePath(t *testing.T) {
	for in, want := range map[string]string{
		"":                  "/",
		"/":                 "/",
		"/orders?x=1#f":     "/orders",
		"/orders/":          "/orders/",
		"//orders///1":      "/orders/1",
		"/%6f%72ders":       "/orders",
		"/a%2fb":            "/a/b",
		"/a%2Fb/../c":       "/a/c",
		"/x/..%2forders":    "/orders",
		"/a%252Fb":          "/a%252Fb",
		"/%7e%41-%5F.%2d":   "/~A-_.-",
		"/a/./b/../../c/.":  "/c/",
		"/../../etc":        "/etc",
		"/a/%2e%2e/b":       "/b",
		"/bad%zz%4":         "/bad%25zz%254",
		"%2%44":             "/%252D", // found by FuzzNormalizePath: not "/%2D", nor "/-" when normalised again
		"*":                 "/*",
		"orders":            "/orders",
		"/%25%36%66rders":   "/%256frders",
		"/caf%C3%A9/%20/x/": "/caf%C3%A9/%20/x/",
	} {
		if got := NormalizePath(in); got != want {
			t.Errorf("NormalizePath(%q) = %q, want %q", in, got, want)
		}
	}
}
