package rlsconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// FuzzParse: Parse never panics; it returns a domain or an error, never
// both and never neither; every error line names the file; the same input
// gives the same answer; a returned domain's descriptors nest at most
// MaxDepth and every rate limit is either unlimited or has a count in
// range and a window in range that is its unit times its multiplier; a
// descriptor has at most MaxLimits, of distinct windows, the first of
// which is its Limit.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/bad/*.yaml")
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		"", "{}", "domain: d", "domain: d\ndescriptors: [{key: k, value: 'a*b*', rate_limit: {unit: minute, requests_per_unit: 3}}]",
		"domain: d\ndescriptors: [{key: k, descriptors: [{key: j, rate_limit: {unlimited: true}}]}]",
		"domain: &a d\ndescriptors: [&b {key: k}, *b]",
		"domain: d\ndescriptors: [{key: k, rate_limits: [{unit: second, requests_per_unit: 3}, {unit: day, unit_multiplier: 2, requests_per_unit: 9}, {window: 90s, requests_per_unit: 4}]}]",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		const name = "fuzz.yaml"
		d, err := Parse(data, name, Options{DefaultMode: "local"})
		if (d == nil) == (err == nil) {
			t.Fatalf("Parse = %v, %v: want exactly one of a domain and an error", d, err)
		}
		_, err2 := Parse(data, name, Options{DefaultMode: "local"})
		if errString(err) != errString(err2) {
			t.Fatalf("Parse is not deterministic:\n%v\n---\n%v", err, err2)
		}
		if err != nil {
			for _, line := range strings.Split(err.Error(), "\n") {
				if !strings.HasPrefix(line, name+": ") {
					t.Fatalf("error line %q lacks the file prefix", line)
				}
			}
			return
		}
		var walk func(ds []*Descriptor, depth int)
		walk = func(ds []*Descriptor, depth int) {
			for _, x := range ds {
				if depth > MaxDepth || x.Key == "" {
					t.Fatalf("descriptor %+v at depth %d", x, depth)
				}
				if len(x.Limits) > MaxLimits || (len(x.Limits) > 0) != (x.Limit != nil) || len(x.Limits) > 0 && x.Limit != x.Limits[0] {
					t.Fatalf("descriptor %+v: limits %v", x, x.Limits)
				}
				windows := map[time.Duration]bool{}
				for _, l := range x.Limits {
					if l.Unlimited {
						continue
					}
					if l.Window <= 0 || l.Window > 366*24*time.Hour || l.UnitMultiplier < 1 || l.Window != time.Duration(l.UnitMultiplier)*Units[l.Unit] ||
						l.RequestsPerUnit < 0 || l.RequestsPerUnit > MaxRequestsPerUnit || windows[l.Window] {
						t.Fatalf("rate limit %+v", l)
					}
					windows[l.Window] = true
				}
				walk(x.Descriptors, depth+1)
			}
		}
		walk(d.Descriptors, 1)
	})
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
