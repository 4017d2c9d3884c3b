package counters

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/engine"
	"github.com/extauthz/extauthz/internal/engine/enginetest"
	"github.com/extauthz/extauthz/internal/quota/local"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// rig is the API on an engine in local mode, with a frozen clock.
type rig struct {
	t       *testing.T
	eng     *engine.Engine
	srv     *httptest.Server
	forgot  []string
	publish []string
}

func newRig(t *testing.T, token string) *rig {
	t.Helper()
	cfg, err := config.Parse([]byte(`
clients:
  keys: [{id: ada, key: key-ada, plan: gold}, {id: bob, key: key-bob}]
plans:
  gold: {limit: 5, window: 1m}
  staff: {unlimited: true}
  default: {limit: 2, window: 1m}
policies:
  - {name: orders, key: [client], limit: plan}
  - {name: everyone, limit: 100, window: 1m}
`), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	e := enginetest.New(t, cfg)
	r := &rig{t: t, eng: e.Engine()}
	lim := local.New(e.Counts)
	h := &Handler{
		Engine:  func() *engine.Engine { return r.eng },
		Forget:  func(p string) { r.forgot = append(r.forgot, p); lim.Forget(p) },
		Publish: func(_ context.Context, p string) error { r.publish = append(r.publish, p); return nil },
		Token:   TokenDigest(token),
		Now:     func() time.Time { return t0 },
		Metrics: NewMetrics(nil),
	}
	mux := http.NewServeMux()
	h.Register(mux)
	r.srv = httptest.NewServer(mux)
	t.Cleanup(r.srv.Close)
	return r
}

func (r *rig) decide(key string) engine.Outcome {
	r.t.Helper()
	var v engine.Verdict
	if err := r.eng.Decide(context.Background(), &engine.Request{Headers: map[string]string{"x-api-key": key}}, t0, &v); err != nil {
		r.t.Fatal(err)
	}
	return v.Outcome
}

func (r *rig) client(token string) *Client { return &Client{Admin: r.srv.URL, Token: token} }

func status(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

func TestAuthorization(t *testing.T) {
	r := newRig(t, "s3cret")
	ctx := context.Background()
	for token, want := range map[string]int{"": 401, "s3cre": 401, "s3cret ": 0, "S3CRET": 401, "s3cret": 0} {
		_, err := r.client(token).Top(ctx, "orders", 10)
		if status(err) != want {
			t.Fatalf("token %q: %v, want status %d", token, err, want)
		}
	}
	off := newRig(t, "")
	if _, err := off.client("anything").Get(ctx, "orders", "client:ada", ""); status(err) != 403 {
		t.Fatalf("no token configured: %v, want 403", err)
	}
}

func TestGetResetTop(t *testing.T) {
	r := newRig(t, "s3cret")
	c := r.client("s3cret")
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		r.decide("key-ada")
	}
	r.decide("key-bob") // bob's plan is plans.default: 2 a minute, both spent
	r.decide("key-bob")

	got, err := c.Get(ctx, "orders", "client:ada", "")
	if err != nil {
		t.Fatal(err)
	}
	// Ada's last request had the gold plan's limit: 5, 3 spent.
	if got.Plan != "gold" || got.Limit != 5 || got.Remaining != 2 || !got.Allowed || got.Where != "local" || got.Rate <= 0 {
		t.Fatalf("get = %+v", got)
	}
	// Another plan's limit, on request; an unknown plan is a 404.
	if got, err := c.Get(ctx, "orders", "client:ada", "default"); err != nil || got.Limit != 2 || got.Remaining != 0 || got.Allowed {
		t.Fatalf("under plans.default: %+v %v", got, err)
	}
	// Reading under another limit changed nothing.
	if got, err := c.Get(ctx, "orders", "client:ada", ""); err != nil || got.Remaining != 2 {
		t.Fatalf("read again under gold: %+v %v", got, err)
	}
	if got, err := c.Get(ctx, "orders", "client:ada", "staff"); err != nil || !got.Unlimited || !got.Allowed {
		t.Fatalf("under the unlimited plan: %+v %v", got, err)
	}
	if _, err := c.Get(ctx, "orders", "client:ada", "platinum"); status(err) != 404 {
		t.Fatalf("unknown plan: %v", err)
	}
	// A key nobody used reads as a full count, and is not created.
	if got, err := c.Get(ctx, "orders", "client:cyd", ""); err != nil || got.Remaining != 2 || got.Plan != "default" || got.Rate != 0 {
		t.Fatalf("unused key: %+v %v", got, err)
	}
	for _, tc := range []struct{ policy, key string }{
		{"orders", ""},                // the policy counts per client
		{"everyone", "client:ada"},    // this one keeps one count
		{"orders", "client:{ada}"},    // braces would change the hash tag
		{"orders", "client:a da"},     // keys are escaped: no spaces
		{"orders", "client:\u00e9da"}, // nor anything outside ASCII
	} {
		if _, err := c.Get(ctx, tc.policy, tc.key, ""); status(err) != 400 {
			t.Fatalf("%s %q: %v, want 400", tc.policy, tc.key, err)
		}
	}
	if _, err := c.Get(ctx, "nope", "", ""); status(err) != 404 {
		t.Fatalf("unknown policy: %v", err)
	}
	if got, err := c.Get(ctx, "everyone", "", ""); err != nil || got.Remaining != 95 {
		t.Fatalf("the one count of everyone: %+v %v", got, err)
	}

	top, err := c.Top(ctx, "orders", 10)
	if err != nil || len(top.Keys) != 2 || top.Keys[0].Key != "client:ada" || top.Keys[0].Remaining != 2 || top.Keys[1].Key != "client:bob" || top.Keys[1].Plan != "default" {
		t.Fatalf("top = %+v %v", top, err)
	}
	if _, err := r.client("s3cret").Top(ctx, "orders", 0); status(err) != 400 {
		t.Fatalf("n = 0: %v", err)
	}

	res, err := c.Reset(ctx, "orders", "client:ada")
	if err != nil || !res.Broadcast || len(r.publish) != 1 || r.publish[0] != "orders:client:ada" || len(r.forgot) != 1 {
		t.Fatalf("reset = %+v %v; published %v, forgot %v", res, err, r.publish, r.forgot)
	}
	if got, _ := c.Get(ctx, "orders", "client:ada", ""); got.Remaining != 5 {
		t.Fatalf("after the reset: %+v", got)
	}
	if r.decide("key-bob") != engine.OverLimit {
		t.Fatal("bob's count was reset too")
	}
}
