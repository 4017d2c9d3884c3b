package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/extauthz/extauthz/internal/config"
)

// printRLQSSummary writes the rate limit quota service's bucket rules,
// domain by domain: what each bucket id a rule matches counts in.
func printRLQSSummary(w io.Writer, q config.RLQS) {
	if len(q.Domains) == 0 {
		return
	}
	fmt.Fprintf(w, "\nrate limit quota service (envoy.service.rate_limit_quota.v3): %d domains, assignments live %s\n", len(q.Domains), q.AssignmentTTL)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DOMAIN\tBUCKET MATCH\tPOLICY\tKEY FROM\tUNKNOWN BUCKETS")
	for _, d := range q.Domains {
		unknown := "deny"
		if d.UnknownAllow {
			unknown = "allow"
		}
		if len(d.Buckets) == 0 {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t%s\n", d.Name, unknown)
		}
		for _, b := range d.Buckets {
			match := "any"
			if len(b.Match) > 0 {
				parts := make([]string, 0, len(b.Match))
				for k, v := range b.Match {
					parts = append(parts, k+"="+v)
				}
				sort.Strings(parts)
				match = strings.Join(parts, ",")
			}
			key := "-"
			if len(b.Key) > 0 {
				key = strings.Join(b.Key, ",")
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", d.Name, match, b.Policy, key, unknown)
		}
	}
	tw.Flush()
}
