package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// replica is one running extauthz.
type replica struct{ *testredis.Proc }

// startReplica runs `extauthz serve` on config and waits until it serves.
func startReplica(bin, dir string, i int, config string) (*replica, error) {
	path := filepath.Join(dir, fmt.Sprintf("replica-%d.yaml", i))
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		return nil, err
	}
	p, err := testredis.Serve(fmt.Sprintf("replica %d", i), []string{fmt.Sprintf("EXTAUTHZ_REPLICA_ID=demo-%d", i)},
		bin, "serve", "-config", path, "-log-format", "json")
	if err != nil {
		return nil, err
	}
	return &replica{p}, nil
}

// peers reads the replica's extauthz_peers gauge from its admin endpoint.
func (r *replica) peers(ctx context.Context) float64 {
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+r.Admin+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "extauthz_peers "); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return n
		}
	}
	return 0
}
