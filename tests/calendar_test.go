package tests

import (
	be "encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// writeZone writes a time zone of one fixed offset (seconds east of UTC)
// in the TZif format (RFC 8536, version 1) as dir/name, for the sidecar
// to load through $ZONEINFO, which Go's time.LoadLocation reads before the
// system's zones: a zone whose midnight is a few seconds away, so a
// calendar quota's reset happens during the test.
func writeZone(t *testing.T, dir, name string, offset int32) {
	t.Helper()
	b := append([]byte("TZif"), make([]byte, 16)...)
	for _, n := range []uint32{0, 0, 0, 0, 1, 4} { // one zone type, "TST\0"
		b = be.BigEndian.AppendUint32(b, n)
	}
	b = be.BigEndian.AppendUint32(b, uint32(offset))
	b = append(b, 0, 0) // not DST, abbreviation at 0
	b = append(b, "TST\x00"...)
	path := filepath.Join(dir, name)
	must(t, os.MkdirAll(filepath.Dir(path), 0o755))
	must(t, os.WriteFile(path, b, 0o644))
}

// midnightAt returns the offset (seconds east of UTC, within ±12h) of a
// zone whose local midnight falls at the whole second at.
func midnightAt(at time.Time) int32 {
	off := (86400 - at.Unix()%86400) % 86400
	if off >= 43200 {
		off -= 86400
	}
	return int32(off)
}

// A daily calendar quota resets at local midnight of its time zone, in
// every mode: the 429s before it point at it (Retry-After and RateLimit t),
// and the quota is whole again at it. The zone is made for the test, with
// midnight a few seconds away (a real zone's midnight would be hours
// away); the sidecar loads it as it loads any IANA zone.
func TestCalendarQuotaResetsAtLocalMidnight(t *testing.T) {
	serial(t, "its requests must land in the two to four seconds before a zone's midnight, a wall-clock window that other tests' load closes")
	srv := testredis.Start(t)
	rdb := srv.Client()
	zones := t.TempDir()
	body := func(zone string) string {
		s := "clients:\n  keys: [{id: ada, key: key-ada}]\npolicies:\n"
		for _, mode := range []string{"local", "redis", "hybrid"} {
			s += fmt.Sprintf("  - {name: %[1]s, match: {path_prefix: /%[1]s}, key: [client], limit: 2, window: 1d, calendar: true, time_zone: %[2]s, mode: %[1]s}\n", mode, zone)
		}
		return defaultsConfig(srv.Addr, "hybrid", s)
	}
	writeZone(t, zones, "Test/Start", 0)
	s := startSidecarFile(t, writeConfig(t, body("Test/Start")), []string{"ZONEINFO=" + zones})
	req := func(mode string) *authv3.CheckRequest {
		return envoyRequest{method: "POST", path: "/" + mode, headers: [][2]string{{"x-api-key", "key-ada"}}}.build()
	}

	// A zone whose midnight is 4s from now, loaded by a reload (start-up
	// takes longer than a reload, and would eat into those seconds). On a
	// machine so loaded that the reload ends less than 2s before
	// midnight, try again with another zone.
	var midnight time.Time
	for attempt := 1; ; attempt++ {
		midnight = redisNow(t, rdb).Add(4 * time.Second).Truncate(time.Second)
		name := "Test/Soon" + strconv.Itoa(attempt)
		writeZone(t, zones, name, midnightAt(midnight))
		writeAtomically(t, s.config, "listen: {grpc: 127.0.0.1:0, admin: 127.0.0.1:0}\n"+body(name))
		waitMetric(t, s, 10*time.Second, float64(attempt), "extauthz_config_reloads_total", "result", "success")
		if time.Until(midnight) >= 2*time.Second || attempt == 3 {
			break
		}
		t.Logf("the reload ended %v before midnight; again", time.Until(midnight))
	}
	if left := time.Until(midnight); left < time.Second {
		t.Fatalf("three reloads ended %v before midnight; the machine is too loaded for this test", left)
	}

	for _, mode := range []string{"local", "redis", "hybrid"} {
		if n, _ := s.admits(2, func() *authv3.CheckRequest { return req(mode) }); n != 2 {
			t.Fatalf("%s: %d of 2 admitted before midnight", mode, n)
		}
		before := redisNow(t, rdb)
		resp := s.check(req(mode))
		after := redisNow(t, rdb)
		if httpStatus(resp) != 429 {
			t.Fatalf("%s: third request before midnight: %d", mode, httpStatus(resp))
		}
		// The wait is to midnight, rounded up to whole seconds, as seen
		// at some instant between before and after.
		h := deniedHeaders(resp)
		retry, _ := strconv.Atoi(h["retry-after"])
		most, least := int(midnight.Sub(before)/time.Second)+1, int(midnight.Sub(after)/time.Second)
		if retry < least || retry > most || h["ratelimit"] != fmt.Sprintf(`"%s";r=0;t=%d`, mode, retry) ||
			h["ratelimit-policy"] != fmt.Sprintf(`"%s";q=2;w=86400`, mode) {
			t.Fatalf("%s: 429 headers %v; want Retry-After and t in [%d, %d], to midnight", mode, h, least, most)
		}
	}

	// Real time has to pass for a real reset: wait for midnight on the
	// clock that decides (Redis TIME for redis and hybrid, this machine's
	// for local; they are the same clock here).
	time.Sleep(time.Until(midnight))
	for redisNow(t, rdb).Before(midnight) {
		time.Sleep(time.Millisecond)
	}
	for _, mode := range []string{"local", "redis", "hybrid"} {
		n, last := s.admits(3, func() *authv3.CheckRequest { return req(mode) })
		if n != 2 {
			t.Fatalf("%s: %d of 3 admitted after midnight, want the new day's 2", mode, n)
		}
		// The next reset is the next midnight, a day away.
		if retry, _ := strconv.Atoi(deniedHeaders(last)["retry-after"]); retry < 86400-60 || retry > 86400 {
			t.Fatalf("%s: after midnight, Retry-After %d; want about a day", mode, retry)
		}
	}
	assertNoFallback(t, []*sidecar{s})
}
