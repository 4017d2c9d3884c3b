package tests

import (
	"bytes"
	"context"
	byteorder "encoding/binary"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/extauthz/extauthz/internal/check"
)

// The transport's own bounds, tested on the wire: an HTTP/2 connection to
// the gRPC listener, framed by hand, so that the test can do what no gRPC
// client does (hold streams open with no message, send header lists far
// past what HTTP/2 permits).

// h2Event is one thing the server did to one stream.
type h2Event struct {
	stream uint32
	rst    http2.ErrCode // RST_STREAM's code, when reset
	reset  bool
	status string // grpc-status of the trailers, when ended by them
	ended  bool
}

// h2Conn is a raw HTTP/2 client connection: the test writes frames, and a
// reader goroutine reports what the server answered, stream by stream.
type h2Conn struct {
	t        *testing.T
	conn     net.Conn
	fr       *http2.Framer
	wmu      sync.Mutex // guards writes on fr, enc and hbuf
	enc      *hpack.Encoder
	hbuf     bytes.Buffer
	next     uint32
	settings chan []http2.Setting // the server's first SETTINGS
	events   chan h2Event
	goaway   chan http2.ErrCode
}

func dialH2(t *testing.T, addr string) *h2Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &h2Conn{t: t, conn: conn, fr: http2.NewFramer(conn, conn), next: 1,
		settings: make(chan []http2.Setting, 1), events: make(chan h2Event, 1<<16), goaway: make(chan http2.ErrCode, 1)}
	c.enc = hpack.NewEncoder(&c.hbuf)
	// Trailers are decoded whatever their size; the server's are small.
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	must(t, c.fr.WriteSettings())
	go c.read()
	return c
}

func (c *h2Conn) read() {
	sent := false
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			close(c.events)
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			if !sent {
				var all []http2.Setting
				f.ForeachSetting(func(s http2.Setting) error { all = append(all, s); return nil })
				c.settings <- all
				sent = true
			}
			c.wmu.Lock()
			c.fr.WriteSettingsAck()
			c.wmu.Unlock()
		case *http2.PingFrame:
			if !f.IsAck() {
				c.wmu.Lock()
				c.fr.WritePing(true, f.Data)
				c.wmu.Unlock()
			}
		case *http2.RSTStreamFrame:
			c.events <- h2Event{stream: f.StreamID, reset: true, rst: f.ErrCode}
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				c.events <- h2Event{stream: f.StreamID, ended: true, status: headerValue(f, "grpc-status")}
			}
		case *http2.GoAwayFrame:
			select {
			case c.goaway <- f.ErrCode:
			default:
			}
		}
	}
}

func headerValue(f *http2.MetaHeadersFrame, name string) string {
	for _, hf := range f.Fields {
		if hf.Name == name {
			return hf.Value
		}
	}
	return ""
}

// serverSettings waits for the server's SETTINGS frame.
func (c *h2Conn) serverSettings() map[http2.SettingID]uint32 {
	c.t.Helper()
	select {
	case all := <-c.settings:
		m := map[http2.SettingID]uint32{}
		for _, s := range all {
			m[s.ID] = s.Val
		}
		return m
	case <-time.After(10 * time.Second):
		c.t.Fatal("no SETTINGS from the server within 10s")
		return nil
	}
}

// open starts a Check stream with the headers a gRPC client sends plus
// extra, and no message: the stream stays open on the client's side. It
// returns the stream's id.
func (c *h2Conn) open(extra ...hpack.HeaderField) uint32 {
	c.t.Helper()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.hbuf.Reset()
	for _, hf := range append([]hpack.HeaderField{
		{Name: ":method", Value: "POST"},
		{Name: ":scheme", Value: "http"},
		{Name: ":path", Value: "/envoy.service.auth.v3.Authorization/Check"},
		{Name: ":authority", Value: "extauthz"},
		{Name: "content-type", Value: "application/grpc"},
		{Name: "te", Value: "trailers"},
	}, extra...) {
		must(c.t, c.enc.WriteField(hf))
	}
	id := c.next
	c.next += 2
	must(c.t, c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true}))
	return id
}

// send writes msg as the stream's one gRPC message and ends the stream.
func (c *h2Conn) send(id uint32, msg proto.Message) {
	c.t.Helper()
	b, err := proto.Marshal(msg)
	must(c.t, err)
	frame := byteorder.BigEndian.AppendUint32([]byte{0}, uint32(len(b)))
	c.wmu.Lock()
	defer c.wmu.Unlock()
	must(c.t, c.fr.WriteData(id, true, append(frame, b...)))
}

// await collects events until done says it has what it waited for, or
// fails the test after limit.
func (c *h2Conn) await(limit time.Duration, what string, done func(h2Event) bool) {
	c.t.Helper()
	timeout := time.After(limit)
	for {
		select {
		case e, ok := <-c.events:
			if !ok {
				c.t.Fatalf("the server closed the connection while waiting for %s", what)
			}
			if e.reset && e.rst == http2.ErrCodeNo {
				continue // after a stream's trailers, when the client had not ended its side
			}
			if done(e) {
				return
			}
		case <-timeout:
			c.t.Fatalf("no %s within %s", what, limit)
		}
	}
}

// Memory bounds for the transport tests, measured after forced GCs.
//
// A held stream (headers, no message) costs the server its transport
// state (the stream, its receive buffer, its metadata, the context and
// timer of its RequestTimeout), at most 4 KiB of heap, and one goroutine
// waiting for its message, on Go's smallest stack (8 KiB): a full
// connection of MaxConcurrentStreams held streams, at most 4 MiB of heap
// and 8 MiB of stacks, whatever the streams refused past the cap (they
// are reset before a goroutine or any state is kept). Measured: 3.4 MiB
// of heap and 7.8 MiB of stacks; RSS grew 13-20 MiB, which also counts
// the heap pages the runtime has freed but not yet returned to the system
// (GOGC=400, internal/gctune, lets the heap run to five times the live
// data between collections, and the scavenger returns pages on its own
// schedule), so RSS is printed, not asserted. Without the cap every one
// of the 4,024 streams is held. Fifty streams of 3,900 HPACK references
// to one 3,960-byte -bin header (1 GB of RSS before the header-list cap)
// grew the heap by 0.1 MiB and RSS by 1.5.
const (
	heldStreamHeap       = 4 << 10
	heldStreamStack      = 8 << 10
	heldStreamsHeapBound = check.MaxConcurrentStreams * heldStreamHeap
	heldStreamsStack     = check.MaxConcurrentStreams * heldStreamStack
	headerListHeapSlack  = 4 << 20
)

// One connection cannot hold more than MaxConcurrentStreams calls: the
// server advertises the cap, resets every stream past it with
// REFUSED_STREAM, and answers each held stream whose message never arrives
// with DEADLINE_EXCEEDED after RequestTimeout, which frees the connection
// for ordinary Checks again.
func TestGRPCStreamCapAndRequestDeadline(t *testing.T) {
	parallel(t)
	s := startVolumeSidecar(t, ordersFor("limit: 100, window: 1m"))
	c := dialH2(t, s.GRPC)
	set := c.serverSettings()
	if got := set[http2.SettingMaxConcurrentStreams]; got != check.MaxConcurrentStreams {
		t.Fatalf("SETTINGS_MAX_CONCURRENT_STREAMS %d (sent: %v), want %d", got, set, check.MaxConcurrentStreams)
	}
	if got := set[http2.SettingMaxHeaderListSize]; got != check.MaxHeaderListBytes {
		t.Fatalf("SETTINGS_MAX_HEADER_LIST_SIZE %d, want %d", got, check.MaxHeaderListBytes)
	}
	heap0, rss0 := s.liveMemory()
	stack0 := s.stackInUse()
	const extra = 3000
	opened := time.Now()
	held := map[uint32]bool{}
	for i := 0; i < check.MaxConcurrentStreams+extra; i++ {
		id := c.open()
		if i < check.MaxConcurrentStreams {
			held[id] = true
		}
	}
	refused := 0
	c.await(30*time.Second, fmt.Sprintf("%d refused streams", extra), func(e h2Event) bool {
		if held[e.stream] {
			t.Fatalf("stream %d, within the cap, was answered before its deadline: %+v", e.stream, e)
		}
		if !e.reset || e.rst != http2.ErrCodeRefusedStream {
			t.Fatalf("stream %d past the cap: %+v, want RST_STREAM REFUSED_STREAM", e.stream, e)
		}
		refused++
		return refused == extra
	})
	heap1, rss1 := s.liveMemory()
	stack1 := s.stackInUse()
	t.Logf("%d streams held, %d refused: heap %s → %s, goroutine stacks %s → %s, RSS %s → %s (+%s)",
		len(held), refused, mib(heap0), mib(heap1), mib(stack0), mib(stack1), mib(rss0), mib(rss1), mib(rss1-rss0))
	if heap1-heap0 > heldStreamsHeapBound {
		t.Fatalf("holding %d streams grew the heap by %s; at most %d KiB a held stream makes %s", len(held), mib(heap1-heap0), heldStreamHeap>>10, mib(heldStreamsHeapBound))
	}
	if stack1-stack0 > heldStreamsStack {
		t.Fatalf("holding %d streams grew the goroutine stacks by %s; one %d KiB stack a held stream makes %s", len(held), mib(stack1-stack0), heldStreamStack>>10, mib(heldStreamsStack))
	}
	// Every held stream is answered once its deadline passes, not before.
	c.await(check.RequestTimeout+30*time.Second, "answer to every held stream", func(e h2Event) bool {
		if !held[e.stream] {
			t.Fatalf("stream %d: %+v, after its refusal", e.stream, e)
		}
		if !e.ended || e.status != "4" {
			t.Fatalf("held stream %d: %+v, want trailers with grpc-status 4 (DEADLINE_EXCEEDED)", e.stream, e)
		}
		delete(held, e.stream)
		return len(held) == 0
	})
	if waited := time.Since(opened); waited < check.RequestTimeout {
		t.Fatalf("held streams answered after %s, before RequestTimeout %s", waited, check.RequestTimeout)
	}
	// The connection serves again.
	id := c.open()
	c.send(id, envoyRequest{headers: [][2]string{{"x-api-key", "key-ada"}}}.build())
	c.await(10*time.Second, "an answer to a Check after the deadline", func(e h2Event) bool {
		if e.stream != id || !e.ended || e.status != "0" {
			t.Fatalf("Check on the freed connection: %+v, want grpc-status 0", e)
		}
		return true
	})
}

// A header list past MaxHeaderListBytes is reset before gRPC decodes it into
// metadata, however few bytes it takes on the wire: HPACK lets one
// 3,960-byte -bin header in the dynamic table be repeated by one-byte
// references, which gRPC's default limit (16 MiB) let through for every
// stream. The connection stays usable for well-formed calls.
func TestGRPCHeaderListCap(t *testing.T) {
	parallel(t)
	s := startVolumeSidecar(t, ordersFor("limit: 100, window: 1m"))
	c := dialH2(t, s.GRPC)
	c.serverSettings()
	big := hpack.HeaderField{Name: "x-big-bin", Value: strings.Repeat("A", 3960)}
	refs := func(n int) []hpack.HeaderField {
		fs := make([]hpack.HeaderField, n)
		for i := range fs {
			fs[i] = big
		}
		return fs
	}
	// 1 MiB of header list as HTTP/2 counts it (4,001 bytes per field).
	mibList := (1 << 20) / (len(big.Name) + len(big.Value) + 32)
	id := c.open(refs(mibList + 1)...)
	c.await(10*time.Second, "a reset of the 1 MiB header list", func(e h2Event) bool {
		if e.stream != id || !e.reset || e.rst != http2.ErrCodeFrameSize {
			t.Fatalf("1 MiB header list: %+v, want RST_STREAM FRAME_SIZE_ERROR", e)
		}
		return true
	})
	heap0, rss0 := s.liveMemory()
	const streams = 50
	ids := map[uint32]bool{}
	for i := 0; i < streams; i++ {
		ids[c.open(refs(3900)...)] = true
	}
	c.await(30*time.Second, fmt.Sprintf("resets of %d oversized header lists", streams), func(e h2Event) bool {
		if !ids[e.stream] || !e.reset || e.rst != http2.ErrCodeFrameSize {
			t.Fatalf("oversized header list: %+v, want RST_STREAM FRAME_SIZE_ERROR", e)
		}
		delete(ids, e.stream)
		return len(ids) == 0
	})
	heap1, rss1 := s.liveMemory()
	t.Logf("%d header lists of 3,900 × %d bytes: heap %s → %s, RSS %s → %s",
		streams, len(big.Value), mib(heap0), mib(heap1), mib(rss0), mib(rss1))
	if heap1-heap0 > headerListHeapSlack {
		t.Fatalf("%d oversized header lists grew the heap by %s (bound %s)", streams, mib(heap1-heap0), mib(headerListHeapSlack))
	}
	// A header list within the cap, on the same connection, is decided.
	id = c.open(hpack.HeaderField{Name: "x-trace-bin", Value: strings.Repeat("A", 4<<10)})
	c.send(id, envoyRequest{headers: [][2]string{{"x-api-key", "key-ada"}}}.build())
	c.await(10*time.Second, "an answer to a Check with 4 KiB of metadata", func(e h2Event) bool {
		if e.stream != id || !e.ended || e.status != "0" {
			t.Fatalf("Check with 4 KiB of metadata: %+v, want grpc-status 0", e)
		}
		return true
	})
}

// rawCodec sends a request's bytes as they are, so a test can send what
// no protobuf library marshals, and decodes replies as protobuf.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) ([]byte, error) { return v.([]byte), nil }

func (rawCodec) Unmarshal(data []byte, v any) error { return proto.Unmarshal(data, v.(proto.Message)) }

// A CheckRequest that does not decode is decided: a 400 with a problem
// body, counted in extauthz_checks_total, never gRPC's Internal error,
// which Envoy's failure_mode_allow would turn into an allow. Two inputs
// reach it: a header value that is not valid UTF-8 (proto3 forbids it;
// older Envoys passed the client's bytes through), and metadata nested
// deeper than protobuf's recursion limit (10,000).
func TestUndecodableCheckRequestIsDecided(t *testing.T) {
	parallel(t)
	s := startSidecar(t, ordersFor("limit: 100, window: 1m"))
	req := envoyRequest{headers: [][2]string{{"x-api-key", "key-ada"}, {"x-note", "PLACEHOLDER"}}}.build()
	valid, err := proto.Marshal(req)
	must(t, err)
	invalidUTF8 := bytes.Replace(valid, []byte("PLACEHOLDER"), []byte("\xff\xfeACEHOLDER"), 1)
	deep := &structpb.Struct{}
	for range 6000 { // 12,000 levels: a Struct and a Value each
		deep = &structpb.Struct{Fields: map[string]*structpb.Value{"a": structpb.NewStructValue(deep)}}
	}
	req.Attributes.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"deep": deep}}
	tooDeep, err := proto.Marshal(req)
	must(t, err)
	before := s.metric("extauthz_checks_total", "outcome", "error")
	for name, msg := range map[string][]byte{"invalid UTF-8": invalidUTF8, "nested 12,000 deep": tooDeep} {
		var resp authv3.CheckResponse
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := s.conn.Invoke(ctx, "/envoy.service.auth.v3.Authorization/Check", msg, &resp, grpc.ForceCodec(rawCodec{}))
		cancel()
		if err != nil {
			t.Fatalf("%s: gRPC error %v, want a decision", name, err)
		}
		if got := httpStatus(&resp); got != 400 || codes.Code(resp.GetStatus().GetCode()) != codes.InvalidArgument {
			t.Fatalf("%s: %d %v, want 400 INVALID_ARGUMENT", name, got, resp.GetStatus())
		}
		if p := problemBody(t, &resp); p["status"] != 400.0 || !strings.Contains(fmt.Sprint(p["detail"]), "could not be decoded") {
			t.Fatalf("%s: problem %v", name, p)
		}
	}
	if got := s.metric("extauthz_checks_total", "outcome", "error") - before; got != 2 {
		t.Fatalf("extauthz_checks_total{outcome=error} rose by %v, want 2", got)
	}
	// The same connection decides a valid request as before.
	if r := s.check(envoyRequest{headers: [][2]string{{"x-api-key", "key-ada"}}}.build()); httpStatus(r) != 200 {
		t.Fatalf("valid request after the undecodable ones: %d", httpStatus(r))
	}
}
