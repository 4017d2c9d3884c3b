package main

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/httpauth"
	"github.com/extauthz/extauthz/internal/rlsconfig"
	"github.com/extauthz/extauthz/internal/rlsenv"
)

func init() {
	register(command{
		name:  "validate",
		usage: "-config FILE",
		short: "check a configuration file and print its policies",
		run:   runValidate,
	})
}

func runValidate(e env, args []string) (int, error) {
	fs := newFlags("validate", e)
	path := fs.String("config", "", "configuration file to check")
	if err := fs.Parse(args); err != nil {
		return 2, err
	}
	if *path == "" && ratelimitEnv() {
		return validateRatelimit(e)
	}
	if *path == "" {
		return 2, fmt.Errorf("%w: -config is required (or, to check envoyproxy/ratelimit's environment, run as %s or with %s set)", errUsage, rlsenv.Binary, rlsenv.ConfigTypeVar)
	}
	cfg, err := config.Load(*path)
	var rc *rlsconfig.Config
	if err == nil {
		rc, err = rlsconfig.LoadFor(cfg)
	}
	if err != nil {
		fmt.Fprintln(e.stderr, err)
		return 1, nil
	}
	for _, w := range cfg.Warnings {
		fmt.Fprintf(e.stderr, "%s: warning: %s\n", cfg.Source, w)
	}
	for _, w := range rlsconfig.WarningsOf(rc) {
		fmt.Fprintf(e.stderr, "warning: %s\n", w)
	}
	fmt.Fprintf(e.stdout, "%s: ok\n", cfg.Source)
	for _, f := range rlsFiles(rc) {
		fmt.Fprintf(e.stdout, "%s: ok\n", f)
	}
	printSummary(e.stdout, cfg)
	printRLSSummary(e.stdout, rc)
	printRLQSSummary(e.stdout, cfg.RLQS)
	return 0, nil
}

func rlsFiles(rc *rlsconfig.Config) []string {
	if rc == nil {
		return nil
	}
	return rc.Files
}

// printRLSSummary writes a table of the rate limit service's descriptors
// that carry a rate limit, domain by domain.
func printRLSSummary(w io.Writer, rc *rlsconfig.Config) {
	if rc == nil {
		return
	}
	names := make([]string, 0, len(rc.Domains))
	for n := range rc.Domains {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(w, "\nrate limit service (envoy.service.ratelimit.v3): %d domains\n", len(names))
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DOMAIN\tDESCRIPTOR\tLIMIT\tALGORITHM\tMODE\tFLAGS")
	for _, n := range names {
		var walk func(prefix string, ds []*rlsconfig.Descriptor)
		walk = func(prefix string, ds []*rlsconfig.Descriptor) {
			for _, d := range ds {
				entry := d.Key
				if d.Value != "" {
					entry += "=" + d.Value
				}
				entry = prefix + entry
				// A descriptor of several limits has a row per limit:
				// all must allow.
				for _, l := range d.Limits {
					limit, alg, mode := "unlimited", "-", "-"
					switch {
					case l.Policy != "":
						limit, alg, mode = "policy "+l.Policy, string(l.Algorithm), string(l.Mode)
					case !l.Unlimited:
						limit, alg, mode = rlsLimit(l), string(l.Algorithm), string(l.Mode)
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", n, entry, limit, alg, mode, rlsFlags(d, l))
				}
				walk(entry+", ", d.Descriptors)
			}
		}
		walk("", rc.Domains[n].Descriptors)
	}
	tw.Flush()
}

// rlsLimit writes a limit's count and window: 10/second, 2/30 seconds.
func rlsLimit(l *rlsconfig.RateLimit) string {
	if l.UnitMultiplier > 1 {
		return fmt.Sprintf("%d/%d %ss", l.RequestsPerUnit, l.UnitMultiplier, l.Unit)
	}
	return fmt.Sprintf("%d/%s", l.RequestsPerUnit, l.Unit)
}

func rlsFlags(d *rlsconfig.Descriptor, l *rlsconfig.RateLimit) string {
	var f []string
	if l.Name != "" {
		f = append(f, "name="+l.Name)
	}
	if len(l.Replaces) > 0 {
		f = append(f, "replaces="+strings.Join(l.Replaces, ","))
	}
	if d.Shadow {
		f = append(f, "shadow")
	}
	if d.Quota {
		f = append(f, "quota")
	}
	if d.ShareThreshold {
		f = append(f, "shared")
	}
	if l.Charge == config.ChargeAlways {
		f = append(f, "charge=always")
	}
	if l.BlockFor > 0 {
		f = append(f, "block_for="+shortDuration(l.BlockFor))
	}
	if !l.Unlimited && l.Mode != config.ModeLocal {
		f = append(f, "on_redis_error="+string(l.OnRedisError))
	}
	if len(f) == 0 {
		return "-"
	}
	return strings.Join(f, " ")
}

// printSummary writes the listeners and a table of policies.
func printSummary(w io.Writer, cfg *config.Config) {
	store := "none (local only)"
	if cfg.Redis != nil {
		store = strings.Join(cfg.Redis.Addrs, ",")
		if sc := cfg.Redis.Sentinel; sc != nil {
			store = fmt.Sprintf("master %q from sentinels %s", sc.MasterName, strings.Join(sc.Addrs, ","))
		}
	}
	reflection := "on"
	if !cfg.Listen.Reflection {
		reflection = "off"
	}
	fmt.Fprintf(w, "grpc %s (reflection %s), http %s, admin %s, redis %s, %d client keys, local cache %d keys\n",
		cfg.Listen.GRPC, reflection, orNone(cfg.Listen.HTTP), orNone(cfg.Listen.Admin), store, len(cfg.Clients.Keys), cfg.Local.MaxKeys)
	if cfg.Listen.HTTP != "" {
		fmt.Fprintf(w, "http door: %s/… (Envoy http_service), %s (nginx auth_request: headers %s, %s), %s (Traefik, Caddy)\n",
			httpauth.EnvoyPrefix, httpauth.NginxPath, cfg.HTTP.URIHeader, cfg.HTTP.MethodHeader, httpauth.ForwardAuthPath)
	}
	if af := cfg.Clients.AuthFailures; af != nil {
		fmt.Fprintf(w, "unknown API keys: at most %d per %s from one client address (IPv4 /%d, IPv6 /%d), then 429 for any key from it\n",
			af.Limit, af.Window, cfg.IPv4Prefix, cfg.IPv6Prefix)
	}
	if len(cfg.Policies) == 0 {
		fmt.Fprintln(w, "no policies: every Check is allowed")
		return
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POLICY\tMATCH\tKEY\tLIMIT\tALGORITHM\tMODE\tFLAGS")
	for _, p := range cfg.Policies {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Name, describeMatch(p.Match), describeKey(p.Key),
			describeLimit(cfg, p), p.Algorithm, p.Mode, describeFlags(p))
	}
	tw.Flush()
	for _, p := range cfg.Policies {
		if p.Algorithm != config.SlidingLog {
			continue
		}
		n := p.Limit
		if p.LimitFrom.From != config.CostConstant {
			n = p.LimitFrom.Max
		}
		for _, plan := range cfg.Plans {
			if p.UsePlan {
				n = max(n, plan.Limit)
			}
		}
		fmt.Fprintf(w, "sliding_log %s: up to %s of logs in this process (%d entries × local.max_keys %d × %d B; local.max_log_bytes %s)\n",
			p.Name, config.FormatBytes(config.SlidingLogBytes(n, cfg.Local.MaxKeys)), n, cfg.Local.MaxKeys, config.LogEntryBytes, config.FormatBytes(cfg.Local.MaxLogBytes))
	}
}

func orNone(s string) string {
	if s == "" {
		return "off"
	}
	return s
}

func describeMatch(m config.Match) string {
	var parts []string
	if len(m.Methods) > 0 {
		parts = append(parts, strings.Join(m.Methods, ","))
	}
	if len(m.Hosts) > 0 {
		parts = append(parts, strings.Join(m.Hosts, ","))
	}
	if m.PathPrefix != "" {
		parts = append(parts, m.PathPrefix+"*")
	}
	for k, v := range m.Context {
		parts = append(parts, k+"="+v)
	}
	for _, h := range m.Headers {
		parts = append(parts, describeValueMatch("header:"+h.Name, h))
	}
	for _, c := range m.Claims {
		parts = append(parts, describeValueMatch("claim:"+c.Name, c))
	}
	if len(m.SourceCIDRs) > 0 {
		nets := make([]string, len(m.SourceCIDRs))
		for i, p := range m.SourceCIDRs {
			nets[i] = p.String()
		}
		parts = append(parts, "from "+strings.Join(nets, ","))
	}
	if m.Not != nil {
		parts = append(parts, "not("+describeMatch(*m.Not)+")")
	}
	if len(parts) == 0 {
		return "every request"
	}
	return strings.Join(parts, " ")
}

func describeValueMatch(what string, vm config.ValueMatch) string {
	switch vm.Kind {
	case config.MatchPresent:
		return what + " present"
	case config.MatchAbsent:
		return what + " absent"
	case config.MatchPrefix:
		return what + "=" + vm.Value + "*"
	case config.MatchRegex:
		return what + "~/" + vm.Value + "/"
	}
	return what + "=" + vm.Value
}

func describeKey(k []config.KeyPart) string {
	if len(k) == 0 {
		return "(one shared bucket)"
	}
	parts := make([]string, len(k))
	for i, p := range k {
		parts[i] = p.String()
	}
	return strings.Join(parts, "+")
}

func describeLimit(cfg *config.Config, p config.Policy) string {
	if p.Unlimited {
		return "unlimited"
	}
	if p.UsePlan {
		names := make([]string, 0, len(cfg.Plans))
		for name, plan := range cfg.Plans {
			if plan.Unlimited {
				names = append(names, name+" unlimited")
				continue
			}
			if p.Calendar {
				names = append(names, fmt.Sprintf("%s %d per %s", name, plan.Limit, calendarNames[plan.Period]))
				continue
			}
			names = append(names, fmt.Sprintf("%s %d/%s", name, plan.Limit, plan.Window))
		}
		sort.Strings(names)
		if p.Calendar {
			names = append(names, "calendar "+p.TimeZone.String())
		}
		from := "plan"
		if p.PlanFrom.Kind != "" {
			from = "plan from " + p.PlanFrom.String()
		}
		return from + " (" + strings.Join(names, ", ") + ")"
	}
	count, per := strconv.FormatInt(p.Limit, 10), "/"
	if p.LimitFrom.From != config.CostConstant {
		count, per = "from "+p.LimitFrom.String(), " per "
	}
	if p.Calendar {
		return fmt.Sprintf("%s per calendar %s (%s)", count, calendarNames[p.Period], p.TimeZone)
	}
	s := count + per + p.Window.String()
	if p.Burst != 0 && p.Burst != p.Limit {
		s += fmt.Sprintf(" burst %d", p.Burst)
	}
	if p.Algorithm == config.LeakyBucket {
		s += fmt.Sprintf(" hold ≤%s", p.MaxDelay)
		if p.Queue > 0 {
			s += fmt.Sprintf(" queue %d", p.Queue)
		}
	}
	return s
}

var calendarNames = map[config.Period]string{
	config.PeriodDay: "day", config.PeriodWeek: "week", config.PeriodMonth: "month", config.PeriodYear: "year",
}

// shortDuration writes d as it is configured: 10m, 1h30m, 90s rather
// than 10m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func describeFlags(p config.Policy) string {
	var f []string
	if p.Shadow {
		f = append(f, "shadow")
	}
	if p.Mode != config.ModeLocal {
		f = append(f, "on_redis_error="+string(p.OnRedisError))
	}
	if p.OnMissingKey == config.MissingReject {
		f = append(f, "missing key=401")
	}
	if p.Charge == config.ChargeAlways {
		f = append(f, "charge=always")
	}
	if p.BlockFor > 0 {
		f = append(f, "block_for="+shortDuration(p.BlockFor))
	}
	if p.Cost != (config.Cost{Units: 1}) {
		f = append(f, "cost="+p.Cost.String())
	}
	if len(f) == 0 {
		return "-"
	}
	return strings.Join(f, " ")
}
