package config

import (
	"strings"
	"testing"
)

// charge: always is a policy's choice for the algorithms that can hold a
// debt; a cost on it, another value or another algorithm is refused with
// the reason.
func TestCharge(t *testing.T) {
	c, err := Parse([]byte("policies:\n  - {name: tokens, key: [header:x-tenant], limit: 100000, window: 24h, charge: always}\n  - {name: plain, limit: 5, window: 1m}\n"), "extauthz.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Policies[0].Charge != ChargeAlways || c.Policies[1].Charge != ChargeRequest {
		t.Fatalf("charges: %q, %q", c.Policies[0].Charge, c.Policies[1].Charge)
	}
	for _, tc := range []struct{ policy, want string }{
		{"{name: p, limit: 5, window: 1m, charge: always, cost: {header: x-tokens}}",
			"policies[0].cost: does not apply to charge: always: Check cannot see the response"},
		{"{name: p, limit: 5, window: 1m, charge: later}",
			`policies[0].charge: "later" is not a choice; choices are request, always`},
		{"{name: p, limit: 5, window: 1m, charge: always, algorithm: leaky_bucket}",
			"policies[0].charge: always does not apply to leaky_bucket"},
		{"{name: p, limit: 5, window: 1m, charge: always, algorithm: sliding_log}",
			"policies[0].charge: always does not apply to sliding_log"},
	} {
		_, err := Parse([]byte("policies:\n  - "+tc.policy+"\n"), "extauthz.yaml")
		if err == nil || !strings.Contains(err.Error(), "extauthz.yaml: "+tc.want) {
			t.Errorf("%s:\n got %v\nwant %s", tc.policy, err, tc.want)
		}
	}
}
