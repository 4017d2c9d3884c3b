package counters

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Client calls a sidecar's counters API.
type Client struct {
	Admin string // the admin listener's host:port
	Token string // the bearer token
	HTTP  *http.Client
}

// Get reads key's count under policy; plan, for a limit: plan policy,
// picks the plan ("" lets the sidecar choose).
func (c *Client) Get(ctx context.Context, policy, key, plan string) (Counter, error) {
	q := url.Values{"key": {key}}
	if plan != "" {
		q.Set("plan", plan)
	}
	var out Counter
	return out, c.do(ctx, http.MethodGet, "/v1/counters/"+url.PathEscape(policy)+"?"+q.Encode(), &out)
}

// Reset resets key's count under policy on every replica.
func (c *Client) Reset(ctx context.Context, policy, key string) (Reset, error) {
	var out Reset
	return out, c.do(ctx, http.MethodDelete, "/v1/counters/"+url.PathEscape(policy)+"?"+url.Values{"key": {key}}.Encode(), &out)
}

// Top lists up to n of policy's keys by recent use on the replica asked.
func (c *Client) Top(ctx context.Context, policy string, n int) (Top, error) {
	var out Top
	return out, c.do(ctx, http.MethodGet, "/v1/counters/"+url.PathEscape(policy)+"/top?n="+strconv.Itoa(n), &out)
}

// Error is an answer other than 200: its status and problem detail.
type Error struct {
	Status int
	Detail string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%d %s: %s", e.Status, http.StatusText(e.Status), e.Detail)
}

func (c *Client) do(ctx context.Context, method, path string, out any) error {
	base := c.Admin
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(base, "/")+path, nil)
	if err != nil {
		return err
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		var p Problem
		if json.Unmarshal(body, &p) != nil || p.Detail == "" {
			p.Detail = strings.TrimSpace(string(body))
		}
		return &Error{Status: resp.StatusCode, Detail: p.Detail}
	}
	return json.Unmarshal(body, out)
}
