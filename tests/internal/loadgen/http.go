package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// HTTPOptions describes a run against HTTP authorization endpoints, sent
// the way nginx's auth_request and the forward-auth proxies send them:
// HTTP/1.1 requests without a body over keep-alive connections, one
// connection per worker, each request waiting for its answer.
type HTTPOptions struct {
	Targets     []string      // host:port
	Requests    int           // total requests
	Concurrency int           // workers, each with its own connection per target
	MaxDuration time.Duration // stop early after this long (0: 2 minutes)
	// Request is the request each worker sends, as bytes on the wire
	// (see RawRequest). It must be a complete HTTP/1.1 request.
	Request []byte
}

// RawRequest renders a bodiless HTTP/1.1 request.
func RawRequest(method, target, host string, headers ...string) []byte {
	b := fmt.Appendf(nil, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, target, host)
	for i := 0; i+1 < len(headers); i += 2 {
		b = fmt.Appendf(b, "%s: %s\r\n", headers[i], headers[i+1])
	}
	return append(b, "\r\n"...)
}

// RunHTTP performs the run described by o. A connection error counts in
// Result.GRPCErrors (the field counts transport errors of either kind);
// a worker whose connection failed or was closed by the server opens
// another.
func RunHTTP(ctx context.Context, o HTTPOptions) (Result, error) {
	if o.Concurrency < 1 || o.Requests < 1 || len(o.Targets) == 0 || len(o.Request) == 0 {
		return Result{}, fmt.Errorf("loadgen: need targets, requests, concurrency and a request")
	}
	if o.MaxDuration <= 0 {
		o.MaxDuration = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, o.MaxDuration)
	defer cancel()

	samples := make([]sample, o.Requests)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < o.Concurrency; w++ {
		wg.Go(func() {
			conns := make([]*httpConn, len(o.Targets))
			defer func() {
				for _, c := range conns {
					c.close()
				}
			}()
			for {
				i := int(next.Add(1) - 1)
				if i >= o.Requests || ctx.Err() != nil {
					return
				}
				target := i % len(o.Targets)
				t0 := time.Now()
				status, err := roundTrip(ctx, &conns[target], o.Targets[target], o.Request)
				samples[i] = sample{latency: time.Since(t0), status: status, target: target, err: err}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if ctx.Err() != nil && int(next.Load()) < o.Requests {
		return Result{}, fmt.Errorf("loadgen: run of %d requests did not finish within %v", o.Requests, o.MaxDuration)
	}

	return summarize(samples, len(o.Targets), elapsed), nil
}

// httpConn is one keep-alive connection.
type httpConn struct {
	c  net.Conn
	br *bufio.Reader
}

func (h *httpConn) close() {
	if h != nil {
		h.c.Close()
	}
}

// roundTrip sends req on *conn (dialling addr when there is none) and
// reads the answer, body included, so the connection can carry the next.
func roundTrip(ctx context.Context, conn **httpConn, addr string, req []byte) (int, error) {
	if *conn == nil {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return 0, err
		}
		*conn = &httpConn{c: c, br: bufio.NewReader(c)}
	}
	h := *conn
	status, closing, err := 0, false, error(nil)
	if _, err = h.c.Write(req); err == nil {
		status, closing, err = readResponse(h.br)
	}
	if err != nil || closing {
		h.close()
		*conn = nil
	}
	return status, err
}

// readResponse reads one HTTP/1.1 response and discards its body. Like
// the gRPC driver's status-only codec (codec.go), it reads only what it
// needs: the status, Content-Length and Connection. Parsing every header
// into a map, as net/http's client does, costs this process more per
// answer than the servers under test differ by, and more for a server
// that sends more headers; nginx, whose requests this imitates, parses
// far more cheaply. Chunked bodies are refused: the servers measured
// send a Content-Length.
func readResponse(br *bufio.Reader) (status int, closing bool, err error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return 0, false, err
	}
	// HTTP/1.1 200 OK
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return 0, false, fmt.Errorf("loadgen: bad status line %q", line)
	}
	status, err = strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, false, fmt.Errorf("loadgen: bad status line %q", line)
	}
	length := -1
	for {
		line, err = br.ReadSlice('\n')
		if err != nil {
			return 0, false, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return 0, false, fmt.Errorf("loadgen: bad header line %q", line)
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.Atoi(string(value)); err != nil {
				return 0, false, fmt.Errorf("loadgen: bad Content-Length %q", value)
			}
		case bytes.EqualFold(name, []byte("Connection")):
			closing = bytes.EqualFold(value, []byte("close"))
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			return 0, false, fmt.Errorf("loadgen: Transfer-Encoding %q is not supported", value)
		}
	}
	if length < 0 {
		return 0, false, fmt.Errorf("loadgen: status %d without Content-Length", status)
	}
	_, err = br.Discard(length)
	return status, closing, err
}
