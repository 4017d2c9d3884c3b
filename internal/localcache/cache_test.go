package localcache

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"
)

func TestBoundNeverExceeded(t *testing.T) {
	for _, bound := range []int{1, 7, 1000, 10_000, 100_000} {
		c, err := New[int](bound, nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.Bound() != bound {
			t.Fatalf("Bound() = %d, want %d", c.Bound(), bound)
		}
		for i := 0; i < 3*bound+100; i++ {
			k := strconv.Itoa(i)
			s := c.Lock(k)
			s.Add(k, i)
			s.Unlock()
			if i%97 == 0 && c.Len() > bound {
				t.Fatalf("bound %d: Len() = %d after %d adds", bound, c.Len(), i+1)
			}
		}
		if n := c.Len(); n > bound || n < bound*9/10 {
			t.Fatalf("bound %d: Len() = %d, want at most the bound and close to it", bound, n)
		}
		if c.Evictions() == 0 {
			t.Fatalf("bound %d: no evictions counted", bound)
		}
	}
}

func TestEvictionCallback(t *testing.T) {
	var evicted []string
	c, err := newSharded[int](2, 1, func(k string, v int) { evicted = append(evicted, fmt.Sprintf("%s=%d", k, v)) })
	if err != nil {
		t.Fatal(err)
	}
	put := func(k string, v int) {
		s := c.Lock(k)
		s.Add(k, v)
		s.Unlock()
	}
	put("a", 1)
	put("b", 2)
	s := c.Lock("a")
	if v, ok := s.Get("a"); !ok || v != 1 { // a becomes most recently used
		t.Fatalf("Get(a) = %d, %v", v, ok)
	}
	s.Unlock()
	put("c", 3) // evicts b, the least recently used
	if len(evicted) != 1 || evicted[0] != "b=2" {
		t.Fatalf("evicted %v, want [b=2]", evicted)
	}
	if c.Evictions() != 1 || c.Len() != 2 {
		t.Fatalf("evictions %d, entries %d; want 1 and 2", c.Evictions(), c.Len())
	}
}

// A scan of keys seen once never pushes out keys in steady use: with 64
// entries, two keys used twice survive a thousand one-off keys.
func TestScanResistance(t *testing.T) {
	c, _ := newSharded[int](64, 1, nil)
	use := func(k string) {
		s := c.Lock(k)
		if _, ok := s.Get(k); !ok {
			s.Add(k, 0)
		}
		s.Unlock()
	}
	for _, k := range []string{"ada", "bob", "ada", "bob"} {
		use(k)
	}
	for i := 0; i < 1000; i++ {
		use("scan" + strconv.Itoa(i))
	}
	for _, k := range []string{"ada", "bob"} {
		s := c.Lock(k)
		_, ok := s.Peek(k)
		s.Unlock()
		if !ok {
			t.Fatalf("%s, used twice, was pushed out by a scan of keys used once", k)
		}
	}
	if n := c.Len(); n != 64 || c.Evictions() != 1002-64 {
		t.Fatalf("%d entries, %d evictions; want 64 and %d", n, c.Evictions(), 1002-64)
	}
}

// An evicted key leaves a ghost: coming back while it is remembered, AddAt
// says when it was pushed out (the instant of the Add that did it), and the
// key goes to the frequent part. A ghost is remembered for about half the
// capacity's evictions.
func TestGhosts(t *testing.T) {
	c, _ := newSharded[int](8, 1, nil)
	add := func(k string, now int64) (int64, bool) {
		s := c.Lock(k)
		defer s.Unlock()
		return s.AddAt(k, 0, now)
	}
	if _, ok := add("x", 1); ok {
		t.Fatal("a new key reported as evicted")
	}
	for i := 0; i < 8; i++ { // the 8th evicts x, at 100+7
		add("s"+strconv.Itoa(i), int64(100+i))
	}
	if at, ok := add("x", 200); !ok || at != 107 {
		t.Fatalf("x came back: evicted at %d, %v; want 107, true", at, ok)
	}
	// x is in frequent now: a scan of 20 keys seen once leaves it.
	for i := 0; i < 20; i++ {
		add("t"+strconv.Itoa(i), int64(300+i))
	}
	s := c.Lock("x")
	_, ok := s.Peek("x")
	s.Unlock()
	if !ok {
		t.Fatal("x, back from eviction, was pushed out by keys seen once")
	}
	// s0 went long ago: 4 ghosts are kept, and 20 keys were evicted since.
	if _, ok := add("s0", 400); ok {
		t.Fatal("a ghost outlived the ghost list's bound")
	}
}

func TestShardSize(t *testing.T) {
	if n := unsafe.Sizeof(Shard[int]{}); n != 128 {
		t.Fatalf("a Shard is %d bytes; the padding keeps it at 128", n)
	}
}

func TestInvalidSizes(t *testing.T) {
	if _, err := New[int](0, nil); err == nil {
		t.Fatal("New(0) should fail")
	}
	if _, err := newSharded[int](10, 3, nil); err == nil {
		t.Fatal("3 shards should fail: not a power of two")
	}
	if _, err := newSharded[int](2, 4, nil); err == nil {
		t.Fatal("more shards than keys should fail")
	}
}

func TestConcurrentUse(t *testing.T) {
	c, _ := New[*int](5000, nil)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 5000; i++ {
				k := strconv.Itoa(i % 3000)
				s := c.Lock(k)
				v, ok := s.Get(k)
				if !ok {
					v = new(int)
					s.Add(k, v)
				}
				*v++
				s.Unlock()
			}
		}(g)
	}
	wg.Wait()
	total := 0
	for i := 0; i < 3000; i++ {
		k := strconv.Itoa(i)
		s := c.Lock(k)
		if v, ok := s.Peek(k); ok {
			total += *v
		}
		s.Unlock()
	}
	if total != 8*5000 {
		t.Fatalf("counted %d increments, want %d", total, 8*5000)
	}
}

// BenchmarkShards compares one shard with the default layout under parallel
// load on a spread of keys: the case for sharding.
func BenchmarkShards(b *testing.B) {
	keys := make([]string, 4096)
	for i := range keys {
		keys[i] = "orders:client:" + strconv.Itoa(i)
	}
	for _, shards := range []int{1, 2, 8, 64} {
		b.Run(fmt.Sprintf("shards=%d", shards), func(b *testing.B) {
			c, _ := newSharded[*int](100_000, shards, nil)
			b.ReportAllocs()
			var next atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				// Each goroutine walks the keys from its own offset, so
				// they do not move through the shards in lockstep.
				i := int(next.Add(1) * 1021)
				for pb.Next() {
					k := keys[i&4095]
					i++
					s := c.Lock(k)
					v, ok := s.Get(k)
					if !ok {
						v = new(int)
						s.Add(k, v)
					}
					*v++
					s.Unlock()
				}
			})
		})
	}
}
