package rlsenv

import (
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Explain writes the environment as the sidecar reads it: every variable
// with its value (or its default, marked so; secrets hidden) and what it
// does, then what the process will serve.
func (e *Env) Explain(w io.Writer) {
	fmt.Fprintln(w, "envoyproxy/ratelimit's environment, as extauthz reads it:")
	width := 0
	for _, v := range e.Vars {
		width = max(width, len(v.Name))
	}
	for _, v := range e.Vars {
		val := strconv.Quote(v.Value)
		if !v.Set {
			val = "(default " + val + ")"
		}
		fmt.Fprintf(w, "  %-*s %s: %s\n", width, v.Name, val, v.Meaning)
	}
	fmt.Fprintln(w, "\nwhich serves:")
	fmt.Fprintf(w, "  gRPC (rate limit service, Check, health) on %s", e.GRPCAddr)
	if t := e.ServerTLS; t != nil {
		fmt.Fprint(w, " over TLS")
		if t.ClientCAFile != "" {
			fmt.Fprint(w, ", client certificates required")
		}
	}
	fmt.Fprintf(w, "\n  /healthcheck, /healthz, /readyz, /metrics on %s\n", e.HTTPAddr)
	if p := e.Prometheus; p != nil {
		fmt.Fprintf(w, "  extauthz's metrics also on %s%s\n", p.Addr, p.Path)
	}
	switch e.ConfigType {
	case ConfigXDS:
		tls := "plaintext"
		if e.XDS.TLS != nil {
			tls = "TLS 1.3"
			if e.XDS.TLS.CertFile != "" {
				tls += " with a client certificate"
			}
		}
		start := "waits for the first configuration before serving"
		if e.ForceStart {
			start = "serves at once, with no limits until the first configuration"
		}
		fmt.Fprintf(w, "  descriptors over xDS from %s (node %s, %s); %s\n", e.XDS.ServerURL, e.XDS.NodeID, tls, start)
	default:
		fmt.Fprintf(w, "  descriptors from the *.yaml files of %s, reloaded when they change\n", e.RuntimeDir)
	}
	if rd := e.Redis; rd != nil {
		where := strings.Join(rd.Addrs, ",")
		if rd.MasterName != "" {
			where = "master " + rd.MasterName + " by sentinels " + where
		}
		fmt.Fprintf(w, "  counts in Redis at %s\n", where)
	} else {
		fmt.Fprintln(w, "  counts in this process (no REDIS_URL)")
	}
	if e.Overlay != "" {
		fmt.Fprintf(w, "  with the extauthz settings of %s\n", e.Overlay)
	}
}
