// Command loadgen drives Check calls at extauthz replicas and prints a JSON
// summary. The end-to-end tests build it without the race detector so that
// rate-dependent properties are measured at a realistic rate; `make bench`
// uses the same package.
//
//	loadgen -targets 127.0.0.1:9001,127.0.0.1:9002 -n 30000 -c 48 \
//	        -H 'x-api-key: key-ada' -vary none
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/extauthz/extauthz/internal/check"
	"github.com/extauthz/extauthz/tests/internal/loadgen"
)

type headerFlags []string

func (h *headerFlags) String() string     { return strings.Join(*h, ", ") }
func (h *headerFlags) Set(v string) error { *h = append(*h, v); return nil }

func main() {
	targets := flag.String("targets", "127.0.0.1:9001", "comma-separated gRPC addresses; requests go round robin")
	n := flag.Int("n", 10000, "requests")
	c := flag.Int("c", 32, "concurrent workers")
	maxDur := flag.Duration("max", 2*time.Minute, "give up after this long")
	method := flag.String("method", "GET", "HTTP method")
	path := flag.String("path", "/", "HTTP path")
	vary := flag.String("vary", "none", "what changes per request: none, ip (a distinct source IP each), apikey (a distinct unknown x-api-key each)")
	var headers headerFlags
	flag.Var(&headers, "H", "header 'name: value' (repeatable)")
	flag.Parse()

	base := map[string]string{}
	for _, h := range headers {
		k, v, ok := strings.Cut(h, ":")
		if !ok {
			fmt.Fprintf(os.Stderr, "loadgen: -H %q is not 'name: value'\n", h)
			os.Exit(2)
		}
		base[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
	}
	build := func(i int) *authv3.CheckRequest {
		spec := check.RequestSpec{Method: *method, Path: *path, Headers: base, Source: "10.0.0.1", Time: time.Now()}
		switch *vary {
		case "ip":
			spec.Source = fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
		case "apikey":
			h := make(map[string]string, len(base)+1)
			for k, v := range base {
				h[k] = v
			}
			h["x-api-key"] = fmt.Sprintf("unknown-%d-%x", i, uint64(i)*0x9e3779b97f4a7c15)
			spec.Headers = h
		}
		return check.NewRequest(spec)
	}
	res, err := loadgen.Run(context.Background(), loadgen.Options{
		Targets:     strings.Split(*targets, ","),
		Requests:    *n,
		Concurrency: *c,
		MaxDuration: *maxDur,
		Request:     build,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	json.NewEncoder(os.Stdout).Encode(res)
}
