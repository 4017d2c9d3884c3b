package engine

import (
	"context"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/quota"
)

// Design note: a request's cost is how many units it spends of each
// matching policy's limit, all or none (quota.Limiter.Take takes n units
// atomically in every algorithm and mode). A constant cost is compiled
// into the policy; a cost read per request (a header a trusted filter
// set, a verified JWT claim, Envoy dynamic metadata) that is missing or is
// not a non-negative integer costs the policy's default instead, which
// validation keeps at 1 or more: a bad value is never a free pass. Each
// such request is counted (extauthz_cost_defaulted_total) and the first
// under a configuration is logged.
//
// A cost above what the limit can ever grant at once (a token bucket's
// capacity, else the limit) is denied by the engine itself, without asking
// the limiter: no store could admit it, and asking would only spend a
// round trip. Cost 0 asks without spending: the answer one unit would get,
// nothing counted.

// Why a cost read from a request was not used.
const (
	costMissing = iota
	costMalformed
	costProblems
)

var costProblemNames = [costProblems]string{"missing", "malformed"}

// costReader is a policy's cost read per request; nil for a constant.
type costReader struct {
	defaulted [costProblems]prometheus.Counter
	warned    atomic.Bool // a defaulted cost was logged under this configuration
}

func (m *Metrics) forCost(policy string) *costReader {
	r := &costReader{}
	for i, name := range costProblemNames {
		r.defaulted[i] = m.CostDefaulted.WithLabelValues(policy, name)
	}
	return r
}

// units returns the cost of request a under p.
func (e *Engine) units(ctx context.Context, p *Policy, a *Request) int64 {
	if p.Cost.From == config.CostConstant {
		return p.Cost.Units
	}
	n, problem := readNumber(a, &p.Cost.RequestValue)
	if problem >= 0 {
		return e.defaultCost(ctx, p, problem)
	}
	return n
}

// readNumber reads a non-negative whole number from request a where v
// says; problem is -1 when it was read, else why not (costMissing,
// costMalformed). Costs and limits read per request both go through it,
// so a value means the same in either.
func readNumber(a *Request, v *config.RequestValue) (n int64, problem int) {
	var pv *structpb.Value
	switch v.From {
	case config.CostHeader:
		s, ok := a.Headers[v.Name]
		if !ok {
			return 0, costMissing
		}
		n, ok := parseUnits(s)
		if !ok {
			return 0, costMalformed
		}
		return n, -1
	case config.CostClaim:
		pv = a.claimValue(v.Name)
	case config.CostMetadata:
		pv = a.Metadata[v.Namespace].GetFields()[v.Name]
	}
	if pv == nil {
		return 0, costMissing
	}
	n, ok := valueUnits(pv)
	if !ok {
		return 0, costMalformed
	}
	return n, -1
}

// defaultCost counts a request whose cost could not be read and returns
// p's default.
func (e *Engine) defaultCost(ctx context.Context, p *Policy, problem int) int64 {
	r := p.costReader
	r.defaulted[problem].Inc()
	if e.warn != nil && r.warned.CompareAndSwap(false, true) {
		e.warn.LogAttrs(ctx, slog.LevelWarn, "a request's cost is "+costProblemNames[problem]+"; charging the policy's default (logged once per configuration, counted in extauthz_cost_defaulted_total)",
			slog.String("policy", p.Name), slog.String("cost", p.Cost.String()))
	}
	return p.Cost.Units
}

// parseUnits reads a non-negative decimal integer, spaces around allowed.
// Anything longer than the longest int64 is malformed before it is parsed:
// strconv's error would copy the whole value (a header of 60 KiB, say).
func parseUnits(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	if len(s) > len("9223372036854775807") {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n >= 0
}

// valueUnits reads a cost from a claim or metadata value: a whole,
// non-negative number (exact in a double: at most 2^53), or a string
// holding one.
func valueUnits(v *structpb.Value) (int64, bool) {
	switch k := v.GetKind().(type) {
	case *structpb.Value_NumberValue:
		f := k.NumberValue
		if f < 0 || f > 1<<53 || f != math.Trunc(f) {
			return 0, false
		}
		return int64(f), true
	case *structpb.Value_StringValue:
		return parseUnits(k.StringValue)
	}
	return 0, false
}

// tooCostly is the decision for a request costing more than l can ever
// grant: denied, with the window as the wait (nothing shorter is true),
// made without asking the limiter.
func tooCostly(l Limit) quota.Decision {
	return quota.Decision{Limit: l.Limit.Limit, RetryAfter: l.Window, ResetAfter: l.Window}
}

// costDetail is the problem detail of a 429 for a request costing more
// than policy t admits at once.
func costDetail(t *Taken) string {
	return "This request costs " + strconv.FormatInt(t.Units, 10) + " units; policy " + t.Policy.Name +
		" admits at most " + strconv.FormatInt(t.Limit.MaxCost(), 10) + " at once, so it is never admitted as sent."
}
