package loadgen

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// readResponse reads what net/http's client reads of the same bytes: the
// status, the body's end (the next response follows), whether the server
// closes.
func TestReadResponseAgreesWithNetHTTP(t *testing.T) {
	stream := "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nRateLimit: \"a\";r=1;t=2\r\nDate: x\r\n\r\n" +
		"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/problem+json\r\nContent-Length: 7\r\nretry-after: 3\r\n\r\n{\"a\":1}" +
		"HTTP/1.1 401 Unauthorized\r\ncontent-length: 2\r\nConnection: close\r\n\r\n{}"
	mine, theirs := bufio.NewReader(strings.NewReader(stream)), bufio.NewReader(strings.NewReader(stream))
	for i := 0; i < 3; i++ {
		status, closing, err := readResponse(mine)
		resp, herr := http.ReadResponse(theirs, nil)
		if err != nil || herr != nil {
			t.Fatalf("response %d: %v, net/http: %v", i, err, herr)
		}
		resp.Body.Close()
		if status != resp.StatusCode || closing != resp.Close {
			t.Fatalf("response %d: status %d close %v; net/http %d %v", i, status, closing, resp.StatusCode, resp.Close)
		}
	}
	for _, bad := range []string{
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\n\r\n",
		"SSH-2.0-OpenSSH\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
	} {
		if _, _, err := readResponse(bufio.NewReader(strings.NewReader(bad))); err == nil {
			t.Errorf("readResponse(%q) succeeded", bad)
		}
	}
}

// A run counts every answer by status over kept-alive connections, and
// opens a new one when the server closes.
func TestRunHTTP(t *testing.T) {
	var n int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n++ // one worker: no race
		switch {
		case r.Header.Get("X-Api-Key") != "k":
			w.WriteHeader(401)
		case n%10 == 0:
			w.Header().Set("Connection", "close")
			w.WriteHeader(429)
		default:
			w.Write([]byte("ok"))
		}
	}))
	defer srv.Close()
	res, err := RunHTTP(context.Background(), HTTPOptions{
		Targets: []string{srv.Listener.Addr().String()}, Requests: 100, Concurrency: 1,
		Request: RawRequest("GET", "/nginx", "h", "X-Api-Key", "k"),
	})
	if err != nil || res.GRPCErrors != 0 || res.Statuses["200"] != 90 || res.Statuses["429"] != 10 {
		t.Fatalf("RunHTTP: %v, %+v", err, res)
	}
}
