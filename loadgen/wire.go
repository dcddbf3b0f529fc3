package loadgen

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/jsonscan"
)

// wire is the driver's HTTP/1.1 client: keep-alive connections to each node, a request
// written and its answer read on the calling worker's goroutine, one connection per
// request in flight.
//
// net/http's Transport hands every request to a writer and a reader goroutine per
// connection and back: three wake-ups per request, which cost the driver about as much
// CPU as the node spent answering a replay. The driver shares the machine's cores with
// the system it measures, so what the driver spends the system cannot. pgx drives
// PostgreSQL the same way this does: the query written and its answer read on the
// caller's goroutine. The answer is still parsed by net/http (http.ReadResponse):
// status, headers, Content-Length or chunked bodies, Connection: close.
type wire struct {
	token   string
	timeout time.Duration
	idle    int // connections kept per node

	mu    sync.Mutex
	nodes map[string]*wireNode // base URL → its connections
}

type wireNode struct {
	scheme, host string // host:port, and the Host header
	idle         chan *wireConn
}

type wireConn struct {
	c         net.Conn
	r         *bufio.Reader
	buf       []byte
	idleSince time.Time
}

// maxIdle is how long a kept connection may wait for its next request: below the
// server's idle timeout (two minutes), so that no request is written to a connection
// the server is closing, as net/http's Transport kept its idle ones 90 s.
const maxIdle = 90 * time.Second

func newWire(token string, timeout time.Duration, idle int) *wire {
	return &wire{token: token, timeout: timeout, idle: idle, nodes: make(map[string]*wireNode)}
}

func (w *wire) node(base string) (*wireNode, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n, ok := w.nodes[base]; ok {
		return n, nil
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("endpoint %q is not http://host:port or https://host:port", base)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[u.Scheme])
	}
	n := &wireNode{scheme: u.Scheme, host: host, idle: make(chan *wireConn, w.idle)}
	w.nodes[base] = n
	return n, nil
}

func (w *wire) dial(ctx context.Context, n *wireNode) (*wireConn, error) {
	d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	var c net.Conn
	var err error
	if n.scheme == "https" {
		td := &tls.Dialer{NetDialer: d} // the system's roots, the endpoint's host name
		c, err = td.DialContext(ctx, "tcp", n.host)
	} else {
		c, err = d.DialContext(ctx, "tcp", n.host)
	}
	if err != nil {
		return nil, err
	}
	return &wireConn{c: c, r: bufio.NewReaderSize(c, 16<<10)}, nil
}

// maxAnswerBytes bounds an answer the driver reads: a record with the largest result
// and its history is far below it.
const maxAnswerBytes = 4 << 20

// answer is what do returns of a response: its status, the leader it names, its body.
type answer struct {
	status int
	leader string
	body   []byte
}

// do sends one request to the node at base and reads its answer. A connection that
// fails, or that the server closes, is not used again.
func (w *wire) do(ctx context.Context, method, base, path string, body []byte) (answer, error) {
	n, err := w.node(base)
	if err != nil {
		return answer{}, err
	}
	c := n.take()
	if c == nil {
		if c, err = w.dial(ctx, n); err != nil {
			return answer{}, err
		}
	}
	deadline := time.Now().Add(w.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	ans, keep, err := c.roundTrip(ctx, deadline, method, n.host, path, w.token, body)
	if err != nil || !keep {
		_ = c.c.Close()
		return ans, err
	}
	c.idleSince = time.Now()
	select {
	case n.idle <- c:
	default:
		_ = c.c.Close()
	}
	return ans, nil
}

// take returns a kept connection that has not waited longer than maxIdle, or nil;
// it closes the ones that have.
func (n *wireNode) take() *wireConn {
	for {
		select {
		case c := <-n.idle:
			if time.Since(c.idleSince) < maxIdle {
				return c
			}
			_ = c.c.Close()
		default:
			return nil
		}
	}
}

func (c *wireConn) roundTrip(ctx context.Context, deadline time.Time, method, host, path, token string, body []byte) (ans answer, keep bool, err error) {
	if err := c.c.SetDeadline(deadline); err != nil {
		return answer{}, false, err
	}
	// A context cancelled mid-request (an interrupted run) ends it at once; its
	// deadline ends it at the socket already. A connection whose cut-off may still
	// come is not used again.
	stop := context.AfterFunc(ctx, func() { _ = c.c.SetDeadline(time.Unix(1, 0)) })
	defer func() {
		if !stop() {
			keep = false
		}
	}()

	b := append(c.buf[:0], method...)
	b = append(b, ' ')
	b = append(b, path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\nUser-Agent: idemkv-bench\r\n"...)
	if body != nil {
		b = append(b, "Content-Type: application/json\r\nContent-Length: "...)
		b = strconv.AppendInt(b, int64(len(body)), 10)
		b = append(b, "\r\n"...)
	}
	if token != "" {
		b = append(b, "Authorization: Bearer "...)
		b = append(b, token...)
		b = append(b, "\r\n"...)
	}
	b = append(b, "\r\n"...)
	b = append(b, body...)
	c.buf = b
	if _, err := c.c.Write(b); err != nil {
		return answer{}, false, err
	}
	resp, err := http.ReadResponse(c.r, &http.Request{Method: method})
	if err != nil {
		return answer{}, false, err
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	_ = resp.Body.Close()
	if err != nil {
		return answer{}, false, err
	}
	if len(data) > maxAnswerBytes {
		return answer{}, false, fmt.Errorf("an answer of more than %d bytes", maxAnswerBytes)
	}
	ans = answer{status: resp.StatusCode, leader: resp.Header.Get(idemkv.HeaderLeader), body: data}
	return ans, !resp.Close && ctx.Err() == nil, nil
}

// close closes every idle connection.
func (w *wire) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, n := range w.nodes {
		for c := n.take(); c != nil; c = n.take() {
			_ = c.c.Close()
		}
	}
}

// members calls fn with the name and the raw value of each member of the JSON object
// in data, in order, without decoding the values: the driver reads two or three
// fields of answers that carry a whole record, and encoding/json.Unmarshal would
// check and walk all of it (a fifth of the driver's CPU under replays). Names are
// compared as they appear, without unescaping: the server writes them plainly.
func members(data []byte, fn func(name, value []byte)) error {
	if !jsonscan.Object(data, func(name, value []byte) bool {
		fn(name, value)
		return true
	}) {
		return errNotAnObject
	}
	return nil
}

var errNotAnObject = errors.New("an answer that is not one JSON object")
