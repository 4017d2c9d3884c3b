package rlsconfig

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/extauthz/extauthz/internal/config"
)

var localOnly = Options{DefaultMode: config.ModeLocal, Source: "extauthz.yaml"}

// Each file under testdata/bad holds one mistake and, on its first line,
// the exact message it must produce: "# want: <path>: <reason>".
func TestBadFiles(t *testing.T) {
	files, err := filepath.Glob("testdata/bad/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			want := wantLine(t, f)
			_, err := Load([]string{f}, localOnly)
			if err == nil {
				t.Fatalf("Load succeeded; want error %q", want)
			}
			for _, line := range strings.Split(err.Error(), "\n") {
				if line == f+": "+want {
					return
				}
			}
			t.Fatalf("error:\n%v\nwant a line:\n%s: %s", err, f, want)
		})
	}
}

func wantLine(t *testing.T, path string) string {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	sc.Scan()
	want, ok := strings.CutPrefix(sc.Text(), "# want: ")
	if !ok {
		t.Fatalf("%s: first line must be '# want: ...'", path)
	}
	return want
}

func write(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A file of every setting: the tree, the defaults and our own fields.
func TestParseEverySetting(t *testing.T) {
	d, err := Parse([]byte(`
domain: shop
descriptors:
  - key: route
    value: "checkout*"
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: user
        detailed_metric: true
        shadow_mode: true
        rate_limit:
          name: per-user
          unit: Minute
          requests_per_unit: 0
          replaces: [{name: a}, {name: b}]
  - key: port
    value: 8080
    rate_limit: {unit: week, requests_per_unit: 7, algorithm: token_bucket, burst: 14, mode: hybrid, on_redis_error: deny}
  - key: paced
    rate_limit: {unit: second, requests_per_unit: 50, algorithm: leaky_bucket, queue: 4, max_delay: 15ms}
  - key: health
    rate_limit: {unlimited: true}
`), "shop.yaml", Options{DefaultMode: config.ModeRedis, Redis: true})
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "shop" || len(d.Descriptors) != 4 {
		t.Fatalf("domain %+v", d)
	}
	route := d.Descriptors[0]
	if route.Value != "checkout*" || strings.Join(route.Wildcard, "|") != "checkout|" || !route.ShareThreshold || !route.ValueToMetric || route.Limit != nil {
		t.Fatalf("route %+v", route)
	}
	user := route.Descriptors[0]
	l := user.Limit
	if user.Path != "descriptors[0].descriptors[0]" || !user.Shadow || !user.DetailedMetric || user.Wildcard != nil {
		t.Fatalf("user %+v", user)
	}
	// Defaults: a fixed window aligned to the unit, the main
	// configuration's default mode, fallback when Redis fails.
	if l.Name != "per-user" || l.Unit != "minute" || l.Window != time.Minute || l.RequestsPerUnit != 0 ||
		l.Algorithm != config.FixedWindow || l.Mode != config.ModeRedis || l.OnRedisError != config.OnErrorFallback ||
		strings.Join(l.Replaces, ",") != "a,b" {
		t.Fatalf("user limit %+v", l)
	}
	// A value YAML reads as a number is the string it spells.
	port := d.Descriptors[1]
	if port.Value != "8080" || port.Limit.Window != 7*24*time.Hour || port.Limit.Burst != 14 || port.Limit.Mode != config.ModeHybrid || port.Limit.OnRedisError != config.OnErrorDeny {
		t.Fatalf("port %+v %+v", port, port.Limit)
	}
	if p := d.Descriptors[2].Limit; p.Queue != 4 || p.MaxDelay != 15*time.Millisecond {
		t.Fatalf("paced %+v", p)
	}
	if h := d.Descriptors[3].Limit; !h.Unlimited || h.Window != 0 {
		t.Fatalf("health %+v", h)
	}
}

// A leaky bucket holds nothing unless told: Envoy gives the call 20ms.
func TestLeakyBucketDefaults(t *testing.T) {
	d, err := Parse([]byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: leaky_bucket}\n"), "d.yaml", localOnly)
	if err != nil {
		t.Fatal(err)
	}
	if l := d.Descriptors[0].Limit; l.MaxDelay != 0 || l.Queue != -1 {
		t.Fatalf("%+v", l)
	}
}

// Descriptors nest at most MaxDepth levels.
func TestDepthIsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: deep\n")
	for i := 0; i <= MaxDepth; i++ {
		b.WriteString(strings.Repeat("  ", 2*i) + "descriptors:\n" + strings.Repeat("  ", 2*i) + "  - key: k\n")
	}
	_, err := Parse([]byte(b.String()), "deep.yaml", localOnly)
	if err == nil || !strings.Contains(err.Error(), "nests deeper than 16 levels") {
		t.Fatalf("error %v", err)
	}
}

// A directory contributes its YAML files in name order, not hidden ones
// (a ConfigMap's ..data) nor other files; two files may not share a
// domain; the digest changes with any file's content.
func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "b.yaml", "domain: b\n")
	write(t, dir, "a.yml", "domain: a\n")
	write(t, dir, "notes.txt", "domain: [")
	write(t, dir, ".hidden.yaml", "domain: [")
	if err := os.Mkdir(filepath.Join(dir, "..data"), 0o700); err != nil {
		t.Fatal(err)
	}
	extra := write(t, t.TempDir(), "c.yaml", "domain: c\n")
	c, err := Load([]string{dir, extra}, localOnly)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "a.yml"), filepath.Join(dir, "b.yaml"), extra}
	if strings.Join(c.Files, " ") != strings.Join(want, " ") || len(c.Domains) != 3 {
		t.Fatalf("files %v, domains %v", c.Files, c.Domains)
	}
	if sum, ok := Sum([]string{dir, extra}); !ok || sum != c.Digest {
		t.Fatal("Sum differs from the digest of what was loaded")
	}
	write(t, dir, "b.yaml", "domain: b\ndescriptors: []\n")
	if sum, _ := Sum([]string{dir, extra}); sum == c.Digest {
		t.Fatal("Sum did not change with a file's content")
	}
	write(t, dir, "d.yaml", "domain: a\n")
	_, err = Load([]string{dir}, localOnly)
	if want := filepath.Join(dir, "d.yaml") + `: domain: "a" is already defined in ` + filepath.Join(dir, "a.yml"); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v; want %s", err, want)
	}
	_, err = Load([]string{filepath.Join(dir, "missing")}, localOnly)
	if err == nil || !strings.HasPrefix(err.Error(), `extauthz.yaml: rls.domains[0]: "`+filepath.Join(dir, "missing")+`" cannot be read: no such file or directory`) {
		t.Fatalf("error %v", err)
	}
	if _, ok := Sum([]string{filepath.Join(dir, "missing")}); ok {
		t.Fatal("Sum of a missing path")
	}
}

// Every file's problems are reported, each with its file.
func TestErrorsOfSeveralFiles(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", "domain: a\ndescriptors: [{key: ''}]\n")
	write(t, dir, "b.yaml", "descriptors: []\n")
	_, err := Load([]string{dir}, localOnly)
	if err == nil {
		t.Fatal("loaded")
	}
	for _, want := range []string{filepath.Join(dir, "a.yaml") + ": descriptors[0].key: is required", filepath.Join(dir, "b.yaml") + ": domain: is required"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error:\n%v\nlacks %s", err, want)
		}
	}
}

// Settings envoyproxy/ratelimit accepts but that do nothing are warnings.
func TestWarnings(t *testing.T) {
	dir := t.TempDir()
	f := write(t, dir, "w.yaml", "domain: w\ndescriptors:\n  - key: k\n    shadow_mode: true\n  - key: h\n    rate_limit: {unlimited: true, requests_per_unit: 3}\n")
	c, err := Load([]string{f}, localOnly)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		f + ": descriptors[0].shadow_mode: has no effect without a rate_limit at this level",
		f + ": descriptors[1].rate_limit.requests_per_unit: is ignored with unlimited: true",
	}
	if strings.Join(c.Warnings, "\n") != strings.Join(want, "\n") {
		t.Fatalf("warnings:\n%s", strings.Join(c.Warnings, "\n"))
	}
}

// A sliding_log descriptor is bounded by the main configuration's
// local.max_keys and local.max_log_bytes, as a policy is: the same file
// is refused under the defaults and accepted where the main configuration
// allows its logs.
func TestSlidingLogMemoryFollowsMainConfiguration(t *testing.T) {
	dir := t.TempDir()
	f := write(t, dir, "logins.yaml", "domain: logins\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1000, algorithm: sliding_log}\n")
	load := func(main string) error {
		t.Helper()
		c, err := config.Parse([]byte(main), "extauthz.yaml")
		if err != nil {
			t.Fatal(err)
		}
		_, err = Load([]string{f}, OptionsFor(c))
		return err
	}
	err := load("local: {max_keys: 100000}\n")
	want := f + ": descriptors[0].rate_limit.requests_per_unit: 1000 needs up to 762.9 MiB of sliding logs in this process (1000 entries × local.max_keys 100000 × 8 B), over local.max_log_bytes (256 MiB)"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("error %v; want %s…", err, want)
	}
	err = load("local: {max_keys: 1000, max_log_bytes: 1MiB}\n")
	if want := "(1000 entries × local.max_keys 1000 × 8 B), over local.max_log_bytes (1 MiB)"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v; want %s", err, want)
	}
	for _, main := range []string{"local: {max_log_bytes: 1GiB}\n", "local: {max_keys: 10000}\n"} {
		if err := load(main); err != nil {
			t.Errorf("%q: %v", main, err)
		}
	}
}

// A *.yaml entry of a directory that cannot be followed is an error naming
// it; one that is not a file (a directory named x.yaml) is left out.
func TestFilesRefusesEntriesThatCannotBeFollowed(t *testing.T) {
	for name, setup := range map[string]func(dir string) error{
		"dangling": func(dir string) error {
			return os.Symlink(filepath.Join(dir, "missing"), filepath.Join(dir, "edge.yaml"))
		},
		"loop": func(dir string) error {
			if err := os.Symlink(filepath.Join(dir, "b.yaml"), filepath.Join(dir, "edge.yaml")); err != nil {
				return err
			}
			return os.Symlink(filepath.Join(dir, "edge.yaml"), filepath.Join(dir, "b.yaml"))
		},
	} {
		dir := t.TempDir()
		if err := setup(dir); err != nil {
			t.Fatal(err)
		}
		_, err := Files([]string{dir}, "main.yaml")
		if err == nil || !strings.HasPrefix(err.Error(), "main.yaml: rls.domains[0]: \""+dir+"/") || !strings.Contains(err.Error(), ".yaml\" cannot be read: ") {
			t.Errorf("%s: %v", name, err)
		}
	}
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o700); err != nil {
		t.Fatal(err)
	}
	if files, err := Files([]string{dir}, "main.yaml"); err != nil || len(files) != 0 {
		t.Errorf("a directory named sub.yaml: %v, %v; want it left out", files, err)
	}
}

// A descriptor's limits: one rate_limit (Limits of one), or a list of
// rate_limits, each with a window of unit × unit_multiplier or a window
// duration, given back in the longest unit that divides it (what the
// answer's current_limit states).
func TestSeveralLimitsAndWindows(t *testing.T) {
	d, err := Parse([]byte(`
domain: api
descriptors:
  - key: user
    rate_limits:
      - {name: burst, unit: second, requests_per_unit: 10}
      - {unit: Day, requests_per_unit: 10000, algorithm: token_bucket}
  - key: half_minute
    rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 2}
  - key: windows
    rate_limits:
      - {window: 90s, requests_per_unit: 1}
      - {window: 5m, requests_per_unit: 2}
      - {window: 2h, requests_per_unit: 3}
      - {window: 336h, requests_per_unit: 4}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
`), "api.yaml", localOnly)
	if err != nil {
		t.Fatal(err)
	}
	user := d.Descriptors[0]
	if len(user.Limits) != 2 || user.Limit != user.Limits[0] {
		t.Fatalf("user limits %+v", user.Limits)
	}
	if b, day := user.Limits[0], user.Limits[1]; b.Name != "burst" || b.Window != time.Second || b.UnitMultiplier != 1 ||
		day.Unit != "day" || day.Window != 24*time.Hour || day.RequestsPerUnit != 10000 || day.Algorithm != config.TokenBucket {
		t.Fatalf("user limits %+v %+v", b, day)
	}
	if l := d.Descriptors[1].Limit; len(d.Descriptors[1].Limits) != 1 || l.Unit != "second" || l.UnitMultiplier != 30 || l.Window != 30*time.Second {
		t.Fatalf("half_minute %+v", l)
	}
	want := []struct {
		unit string
		mult int64
	}{{"second", 90}, {"minute", 5}, {"hour", 2}, {"week", 2}}
	for i, l := range d.Descriptors[2].Limits {
		if l.Unit != want[i].unit || l.UnitMultiplier != want[i].mult || l.Window != time.Duration(want[i].mult)*Units[want[i].unit] {
			t.Errorf("windows[%d]: %s × %d (%s), want %s × %d", i, l.Unit, l.UnitMultiplier, l.Window, want[i].unit, want[i].mult)
		}
	}
	if l := d.Descriptors[3].Limit; l.UnitMultiplier != 1 || l.Window != time.Minute {
		t.Fatalf("plain %+v", l)
	}
	for w, s := range map[time.Duration]string{time.Second: "1s", 90 * time.Second: "90s", 5 * time.Minute: "5m", 24 * time.Hour: "1d", 30 * 24 * time.Hour: "30d", 36 * time.Hour: "36h"} {
		if got := FormatWindow(w); got != s {
			t.Errorf("FormatWindow(%s) = %s, want %s", w, got, s)
		}
	}
}
