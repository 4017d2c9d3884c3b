package engine

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

// sfItem is one parsed RFC 8941 list member whose bare item is a string.
type sfItem struct {
	str    string
	params []sfParam
}

type sfParam struct {
	key string
	val int64
}

// parseSFStringItem parses s strictly as an RFC 8941 sf-list holding one
// member: an sf-string followed by parameters whose values are
// sf-integers (the only shape RateLimit and RateLimit-Policy items take).
// It is written from the RFC's ABNF (sections 3.1.2, 3.3.1, 3.3.3), not
// from the renderer.
func parseSFStringItem(s string) (sfItem, error) {
	var it sfItem
	i := 0
	if i >= len(s) || s[i] != '"' {
		return it, fmt.Errorf("item does not start with DQUOTE")
	}
	i++
	var b strings.Builder
	for {
		if i >= len(s) {
			return it, fmt.Errorf("unterminated sf-string")
		}
		c := s[i]
		switch {
		case c == '\\':
			if i+1 >= len(s) || (s[i+1] != '"' && s[i+1] != '\\') {
				return it, fmt.Errorf("bad escape at %d", i)
			}
			b.WriteByte(s[i+1])
			i += 2
			continue
		case c == '"':
			i++
		case c < 0x20 || c > 0x7e:
			return it, fmt.Errorf("byte %#x at %d is not allowed in an sf-string", c, i)
		default:
			b.WriteByte(c)
			i++
			continue
		}
		break
	}
	it.str = b.String()
	for i < len(s) {
		if s[i] != ';' {
			return it, fmt.Errorf("want ';' at %d, got %q", i, s[i:])
		}
		i++
		for i < len(s) && s[i] == ' ' {
			i++
		}
		// key = ( lcalpha / "*" ) *( lcalpha / DIGIT / "_" / "-" / "." / "*" )
		start := i
		for i < len(s) {
			c := s[i]
			lc := c >= 'a' && c <= 'z'
			if !(lc || c == '*' || (i > start && ((c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.'))) {
				break
			}
			i++
		}
		if i == start {
			return it, fmt.Errorf("empty parameter key at %d", start)
		}
		p := sfParam{key: s[start:i]}
		if i >= len(s) || s[i] != '=' {
			return it, fmt.Errorf("parameter %s has no integer value", p.key)
		}
		i++
		// sf-integer = ["-"] 1*15DIGIT
		start = i
		if i < len(s) && s[i] == '-' {
			i++
		}
		digits := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if n := i - digits; n < 1 || n > 15 {
			return it, fmt.Errorf("parameter %s: %q is not an sf-integer (1 to 15 digits)", p.key, s[start:i])
		}
		v, err := strconv.ParseInt(s[start:i], 10, 64)
		if err != nil {
			return it, err
		}
		p.val = v
		for _, q := range it.params {
			if q.key == p.key {
				return it, fmt.Errorf("parameter %s repeated", p.key)
			}
		}
		it.params = append(it.params, p)
	}
	return it, nil
}

func (it sfItem) param(k string) (int64, bool) {
	for _, p := range it.params {
		if p.key == k {
			return p.val, true
		}
	}
	return 0, false
}

// printable is s with everything outside printable ASCII dropped: what an
// sf-string can carry of a policy name.
func printable(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x20 && s[i] < 0x7f {
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

// wantSeconds is d in whole seconds rounded up, at least lo, capped at the
// largest sf-integer. It rounds in uint64, where d + 1s cannot overflow.
func wantSeconds(d time.Duration, lo int64) int64 {
	var s int64
	if d > 0 {
		s = int64((uint64(d) + uint64(time.Second) - 1) / uint64(time.Second))
	}
	return clampInt(s, lo)
}

func clampInt(v, lo int64) int64 { return min(max(v, lo), sfIntMax) }

// FuzzSFHeaders: RateLimit-Policy and RateLimit items, for any policy name
// and any numbers, are valid RFC 8941 list members (an sf-string with
// sf-integer parameters q, w or r, t) that say what they were given: the
// name's printable characters, the numbers clamped to the field's range.
func FuzzSFHeaders(f *testing.F) {
	f.Add("orders", int64(100), int64(time.Minute), int64(0), int64(59*time.Second))
	f.Add(`a"b\c`, int64(1), int64(time.Millisecond), int64(-1), int64(-1))
	f.Add("\x00\xff\u00e9\t\r\n", int64(0), int64(0), int64(1), int64(1))
	f.Add("", int64(1<<40), int64(366*24*time.Hour), int64(1<<40), int64(time.Nanosecond))
	// Durations within a second of the largest: d + 1s - 1 overflows.
	f.Add("x", int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64-1))
	f.Fuzz(func(t *testing.T, name string, q, w, r, reset int64) {
		checkItem(t, fmt.Sprintf("policyHeader(%q, %d, %v)", name, q, time.Duration(w)), policyHeader(name, q, time.Duration(w)),
			name, "q", clampInt(q, 0), "w", wantSeconds(time.Duration(w), 1))
		checkItem(t, fmt.Sprintf("RateLimitHeader(%q, %d, %v)", name, r, time.Duration(reset)), RateLimitHeader(name, r, time.Duration(reset)),
			name, "r", clampInt(r, 0), "t", wantSeconds(time.Duration(reset), 0))

		// appendSFString appends: what came before stays.
		if got := string(appendSFString([]byte("x;"), name)); !strings.HasPrefix(got, "x;") || got[2:] != string(appendSFString(nil, name)) {
			t.Fatalf("appendSFString onto a prefix = %q", got)
		}
	})
}

func TestParseSFStringItemRejects(t *testing.T) {
	for _, s := range []string{
		``, `orders`, `"orders`, `"a\b"`, "\"a\x7f\"", `"a";Q=1`, `"a";q`, `"a";q=`, `"a";q=1.5`,
		`"a";q=1234567890123456`, `"a";q=1;q=2`, `"a" ;q=1`, `"a";q=1,`, `"a";1=1`,
	} {
		if _, err := parseSFStringItem(s); err == nil {
			t.Errorf("parseSFStringItem(%q) accepted it", s)
		}
	}
	it, err := parseSFStringItem(`"a\"b\\";q=-1; w=999999999999999`)
	if err != nil || it.str != `a"b\` || len(it.params) != 2 || it.params[0] != (sfParam{"q", -1}) || it.params[1] != (sfParam{"w", 999999999999999}) {
		t.Fatalf("parseSFStringItem = %+v, %v", it, err)
	}
}

// checkItem fails t unless header, the result of call, is a structured-field
// string item naming name with exactly the parameters a=wantA and b=wantB.
func checkItem(t *testing.T, call, header, name, a string, wantA int64, b string, wantB int64) {
	t.Helper()
	it, err := parseSFStringItem(header)
	if err != nil {
		t.Fatalf("%s = %s: %v", call, header, err)
	}
	ga, oka := it.param(a)
	gb, okb := it.param(b)
	if it.str != printable(name) || len(it.params) != 2 || !oka || !okb {
		t.Fatalf("%s = %s: want the name and %s, %s", call, header, a, b)
	}
	if ga != wantA || gb != wantB {
		t.Fatalf("%s = %s: want %s=%d;%s=%d", call, header, a, wantA, b, wantB)
	}
}
