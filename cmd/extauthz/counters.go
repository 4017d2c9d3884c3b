package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/counters"
)

func init() {
	register(command{
		name:  "counters",
		usage: "get|reset|top [-admin HOST:PORT] [-json] [-plan PLAN] [-n N] POLICY [KEY]",
		short: "read, reset or list a policy's counters through a sidecar's admin API",
		run:   runCounters,
	})
}

func runCounters(e env, args []string) (int, error) {
	if len(args) == 0 {
		return 2, fmt.Errorf("%w: need get, reset or top", errUsage)
	}
	sub := args[0]
	fs := newFlags("counters "+sub, e)
	admin := fs.String("admin", config.DefaultAdmin, "the sidecar's admin address")
	asJSON := fs.Bool("json", false, "print the API's JSON answer")
	plan := fs.String("plan", "", "get: the plan whose limit applies (limit: plan policies; default: the key's last, else plans.default)")
	n := fs.Int("n", 10, "top: how many keys")
	timeout := fs.Duration("timeout", 10*time.Second, "give up after this long")
	if err := fs.Parse(args[1:]); err != nil {
		return 2, err
	}
	want := map[string][2]int{"get": {1, 2}, "reset": {1, 2}, "top": {1, 1}}
	nargs, ok := want[sub]
	if !ok {
		return 2, fmt.Errorf("%w: %q is not get, reset or top", errUsage, sub)
	}
	if fs.NArg() < nargs[0] || fs.NArg() > nargs[1] {
		return 2, fmt.Errorf("%w: counters %s takes POLICY%s", errUsage, sub, map[bool]string{true: " [KEY]", false: ""}[nargs[1] == 2])
	}
	policy, key := fs.Arg(0), fs.Arg(1)
	c := &counters.Client{Admin: *admin, Token: os.Getenv(counters.TokenEnv)}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var out any
	var err error
	switch sub {
	case "get":
		out, err = c.Get(ctx, policy, key, *plan)
	case "reset":
		out, err = c.Reset(ctx, policy, key)
	case "top":
		out, err = c.Top(ctx, policy, *n)
	}
	if err != nil {
		if ae, ok := err.(*counters.Error); ok && ae.Status == 401 && c.Token == "" {
			return 1, fmt.Errorf("%w (set $%s to the sidecar's token)", err, counters.TokenEnv)
		}
		return 1, err
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return 0, enc.Encode(out)
	}
	switch v := out.(type) {
	case counters.Counter:
		printCounter(e.stdout, v)
	case counters.Reset:
		where := "on every replica (announced through Redis)"
		if !v.Broadcast {
			where = "on this replica (no Redis: each replica counts alone)"
		}
		fmt.Fprintf(e.stdout, "reset %s %s %s\n", v.Policy, orAll(v.Key), where)
	case counters.Top:
		printTop(e.stdout, v)
	}
	return 0, nil
}

func orAll(key string) string {
	if key == "" {
		return "(its one count)"
	}
	return key
}

func printCounter(w io.Writer, c counters.Counter) {
	fmt.Fprintf(w, "policy %s, key %s: %s mode, %s\n", c.Policy, orAll(c.Key), c.Mode, c.Algorithm)
	if c.Unlimited {
		fmt.Fprintf(w, "unlimited%s: never denied, no count kept\n", planNote(c.Plan))
		return
	}
	next := "allowed"
	if !c.Allowed {
		next = "denied"
	}
	fmt.Fprintf(w, "limit %d per %s%s: %d remaining, whole again in %s; one more unit now: %s\n",
		c.Limit, time.Duration(c.WindowSeconds)*time.Second, planNote(c.Plan), c.Remaining, seconds(c.ResetSeconds), next)
	switch c.Where {
	case "redis":
		fmt.Fprintf(w, "counted in redis: %s", strings.Join(c.RedisKeys, " "))
		if c.Leased > 0 {
			fmt.Fprintf(w, "; this replica holds %d leased tokens", c.Leased)
		}
		fmt.Fprintln(w)
	default:
		fmt.Fprintln(w, "counted on this replica alone (local mode)")
	}
	fmt.Fprintf(w, "recent use on this replica: %.2f requests/s\n", c.Rate)
}

func planNote(plan string) string {
	if plan == "" {
		return ""
	}
	return " (plan " + plan + ")"
}

func seconds(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond).String()
}

func printTop(w io.Writer, t counters.Top) {
	if len(t.Keys) == 0 {
		fmt.Fprintf(w, "policy %s: no key used recently on this replica\n", t.Policy)
		return
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tREQ/S\tREMAINING\tLIMIT\tRESET\tPLAN")
	for _, c := range t.Keys {
		remaining, limit, reset := fmt.Sprint(c.Remaining), fmt.Sprint(c.Limit), seconds(c.ResetSeconds)
		switch {
		case c.Error != "":
			remaining, reset = "?", c.Error
		case c.Unlimited:
			remaining, limit, reset = "-", "unlimited", "-"
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%s\t%s\t%s\t%s\n", orAll(c.Key), c.Rate, remaining, limit, reset, c.Plan)
	}
	tw.Flush()
}
