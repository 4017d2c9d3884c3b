package rlsconfig

import (
	"strings"
	"testing"

	"github.com/extauthz/extauthz/internal/config"
)

const chargeMain = `policies:
  - name: tokens
    key: [header:x-tenant]
    limit: 100000
    window: 24h
    charge: always
  - name: by_ip
    key: [ip]
    limit: 10
    window: 1m
  - name: daily
    key: [header:x-tenant]
    limit: 10
    window: 1d
    calendar: true
`

// A rate limit may count in a policy's bucket (policy: NAME), taking the
// policy's limit whole, and charge: always on its own; each mistake is
// named with its file, path and the choices.
func TestChargeAndSharedPolicy(t *testing.T) {
	c, err := config.Parse([]byte(chargeMain), "extauthz.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	f := write(t, dir, "llm.yaml", `domain: llm
descriptors:
  - key: tenant
    rate_limit: {policy: tokens}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10, charge: always}
`)
	rc, err := Load([]string{f}, OptionsFor(c))
	if err != nil {
		t.Fatal(err)
	}
	ds := rc.Domains["llm"].Descriptors
	if l := ds[0].Limit; l.Policy != "tokens" || l.Charge != config.ChargeAlways || l.Algorithm != config.TokenBucket {
		t.Fatalf("shared: %+v", l)
	}
	if l := ds[1].Limit; l.Charge != config.ChargeAlways || l.Policy != "" {
		t.Fatalf("own: %+v", l)
	}

	for _, tc := range []struct{ file, want string }{
		{"descriptors: [{key: tenant, rate_limit: {policy: nope}}]",
			`descriptors[0].rate_limit.policy: "nope" is not a policy of the main configuration (extauthz.yaml); choices are by_ip, daily, tokens`},
		{"descriptors: [{key: tenant, rate_limit: {policy: tokens, unit: day}}]",
			"descriptors[0].rate_limit.unit: comes from policy tokens with policy: set; remove it"},
		{"descriptors: [{key: a, descriptors: [{key: b, rate_limit: {policy: tokens}}]}]",
			`descriptors[0].descriptors[0].rate_limit.policy: "tokens" has 1 key parts (header:x-tenant) and this descriptor 2 entries`},
		{"descriptors: [{key: ip, rate_limit: {policy: by_ip}}]",
			`descriptors[0].rate_limit.policy: "by_ip" is keyed by ip`},
		{"descriptors: [{key: t, rate_limit: {policy: daily}}]",
			`descriptors[0].rate_limit.policy: "daily" counts calendar windows`},
		{"descriptors: [{key: t, rate_limit: {unit: minute, requests_per_unit: 5, charge: sometimes}}]",
			`descriptors[0].rate_limit.charge: "sometimes" is not a choice; choices are request, always`},
		{"descriptors: [{key: t, rate_limit: {unit: minute, requests_per_unit: 5, charge: always, algorithm: sliding_log}}]",
			"descriptors[0].rate_limit.charge: always does not apply to sliding_log"},
	} {
		f := write(t, dir, "bad.yaml", "domain: bad\n"+tc.file+"\n")
		_, err := Load([]string{f}, OptionsFor(c))
		if err == nil || !strings.Contains(err.Error(), f+": "+tc.want) {
			t.Errorf("%s:\n got %v\nwant %s: %s", tc.file, err, f, tc.want)
		}
	}
}
