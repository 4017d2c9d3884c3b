package topkeys

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()

// On a Zipf stream over 100,000 keys, a summary of 256 holds the true ten
// most used keys, in order, with rates close to the truth.
func TestHeavyHittersOfAZipfStream(t *testing.T) {
	tr := New(256, time.Hour) // a half-life far longer than the stream: counts, not rates
	rng := rand.New(rand.NewPCG(1, 2))
	z := rand.NewZipf(rng, 1.1, 1, 99_999)
	names := make([]string, 100_000)
	for i := range names {
		names[i] = "k" + strconv.Itoa(i)
	}
	exact := make([]int, len(names))
	const n = 200_000
	for i := 0; i < n; i++ {
		k := z.Uint64()
		exact[k]++
		tr.Observe(names[k], t0, 0)
	}
	type kc struct {
		k string
		c int
	}
	var truth []kc
	for k, c := range exact {
		truth = append(truth, kc{names[k], c})
	}
	slices.SortFunc(truth, func(a, b kc) int { return b.c - a.c })
	top := tr.Top(10, t0)
	perObservation := math.Ln2 / time.Hour.Seconds() // the rate one observation adds at t0
	for i, e := range top {
		if e.Key != truth[i].k {
			t.Fatalf("rank %d: %s, want %s (truth %v)", i, e.Key, truth[i].k, truth[:10])
		}
		count := e.Rate / perObservation
		if got, want := count, float64(truth[i].c); math.Abs(got-want) > 0.02*want || e.Error/perObservation > 0.02*want {
			t.Fatalf("%s: count %.0f (error bound %.0f), want %.0f", e.Key, got, e.Error/perObservation, want)
		}
	}
	if tr.Len() != 256 {
		t.Fatalf("holds %d keys, want the capacity, 256", tr.Len())
	}
}

// Counts decay: a key busy an hour ago ranks below one in use now, and a
// steady rate reads as that rate.
func TestRecentUseWins(t *testing.T) {
	tr := New(16, time.Minute)
	for i := 0; i < 10_000; i++ { // 100 a second for 100s, an hour ago
		tr.Observe("old", t0+int64(i)*int64(10*time.Millisecond), 0)
	}
	now := t0 + int64(time.Hour)
	for i := 0; i < 6000; i++ { // 10 a second for the last 10 minutes
		tr.Observe("new", now-int64(10*time.Minute)+int64(i)*int64(100*time.Millisecond), 7)
	}
	top := tr.Top(2, now)
	if len(top) != 2 || top[0].Key != "new" || top[1].Key != "old" || top[0].Aux != 7 {
		t.Fatalf("top = %+v", top)
	}
	// Ten half-lives of a steady 10/s: the estimate is within 0.1%
	// (2^-10) of 10/s, minus the granularity of the observations.
	if r := top[0].Rate; math.Abs(r-10) > 0.05 {
		t.Fatalf("rate of new = %v, want 10/s", r)
	}
	if r := top[1].Rate; r > 1e-10 {
		t.Fatalf("rate of old = %v, want about 0 after 60 half-lives", r)
	}
}

// Weights are scaled back long before they could overflow: a day of
// observations (1,440 half-lives) keeps finite rates in the right order.
func TestRescaling(t *testing.T) {
	tr := New(4, time.Minute)
	for m := 0; m < 24*60; m++ {
		ns := t0 + int64(m)*int64(time.Minute)
		tr.Observe("a", ns, 0)
		tr.Observe("a", ns, 0)
		tr.Observe("b", ns, 0)
	}
	top := tr.Top(2, t0+int64(24*time.Hour))
	if top[0].Key != "a" || math.IsInf(top[0].Rate, 0) || math.IsNaN(top[0].Rate) || top[0].Rate <= top[1].Rate {
		t.Fatalf("top = %+v", top)
	}
	if ratio := top[0].Rate / top[1].Rate; math.Abs(ratio-2) > 1e-6 {
		t.Fatalf("a is used twice as much as b; rates %v", top)
	}
}

// Memory is bounded by the capacity, whatever the number of keys.
func TestBounded(t *testing.T) {
	tr := New(100, time.Minute)
	for i := 0; i < 20_000; i++ {
		tr.Observe(fmt.Sprint(i), t0+int64(i), 0)
	}
	if tr.Len() != 100 || len(tr.index) != 100 {
		t.Fatalf("holds %d keys (%d indexed), want 100", tr.Len(), len(tr.index))
	}
	held := tr.Top(1, t0)[0].Key
	tr.Forget(held)
	if tr.Len() != 99 {
		t.Fatalf("after Forget: %d keys", tr.Len())
	}
	if _, ok := tr.Lookup(held, t0); ok {
		t.Fatal("a forgotten key is still held")
	}
}

// Observing a key already held allocates nothing.
func TestObserveHeldKeyDoesNotAllocate(t *testing.T) {
	tr := New(16, time.Minute)
	tr.Observe("orders:client:ada", t0, 0)
	ns := t0
	if n := testing.AllocsPerRun(1000, func() { ns += 1000; tr.Observe("orders:client:ada", ns, 0) }); n != 0 {
		t.Fatalf("%v allocations per observation", n)
	}
}

func BenchmarkObserve(b *testing.B) {
	tr := New(1024, time.Minute)
	keys := make([]string, 64)
	for i := range keys {
		keys[i] = fmt.Sprintf("orders:client:%d", i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		tr.Observe(keys[i&63], t0+int64(i), 0)
		i++
	}
}

// Every observation a new key, as under 100,000 uniform keys: each
// replaces the least used.
func BenchmarkObserveNewKeys(b *testing.B) {
	tr := New(1024, time.Minute)
	keys := make([]string, 1<<16)
	for i := range keys {
		keys[i] = fmt.Sprintf("orders:client:%d", i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		tr.Observe(keys[i&(1<<16-1)], t0+int64(i), 0)
		i++
	}
}

// A key that becomes busy while the summary is full of keys used once
// each is admitted, and ranks first.
func TestLateHeavyKeyIsAdmitted(t *testing.T) {
	tr := New(64, time.Hour)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 40_000; i++ {
		k := fmt.Sprintf("noise%d", i)
		if i > 20_000 && rng.IntN(20) == 0 { // 5% of the second half
			k = "heavy"
		}
		tr.Observe(k, t0+int64(i), 0)
	}
	if top := tr.Top(1, t0+40_000); top[0].Key != "heavy" {
		t.Fatalf("top = %+v", top)
	}
}
