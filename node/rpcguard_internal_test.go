package node

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"testing"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
)

// readerConn is a net.Conn that reads from r and discards writes.
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c readerConn) Read(b []byte) (int, error)  { return c.r.Read(b) }
func (c readerConn) Write(b []byte) (int, error) { return len(b), nil }
func (c readerConn) Close() error                { return nil }
func (c readerConn) RemoteAddr() net.Addr        { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// appendStream is count AppendEntries requests from n2 of entries entries of size
// bytes each, framed as raft's NetworkTransport sends them.
func appendStream(tb testing.TB, count, entries, size int) []byte {
	tb.Helper()
	req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("n2"), Addr: []byte("127.0.0.1:7421")}, Term: 3}
	for i := range entries {
		req.Entries = append(req.Entries, &raft.Log{Index: uint64(i + 1), Term: 3, Type: raft.LogCommand, Data: bytes.Repeat([]byte{'x'}, size)})
	}
	var buf bytes.Buffer
	enc := codec.NewEncoder(&buf, &codec.MsgpackHandle{})
	for range count {
		buf.WriteByte(rpcAppendEntries)
		if err := enc.Encode(req); err != nil {
			tb.Fatal(err)
		}
	}
	return buf.Bytes()
}

// decodeAll reads every request from c as raft's transport does.
func decodeAll(tb testing.TB, c io.Reader, count int) {
	r := bufio.NewReader(c)
	dec := codec.NewDecoder(r, &codec.MsgpackHandle{})
	for range count {
		if _, err := r.ReadByte(); err != nil {
			tb.Fatal(err)
		}
		var req raft.AppendEntriesRequest
		if err := dec.Decode(&req); err != nil {
			tb.Fatal(err)
		}
	}
}

// The guard hands raft the bytes it was sent, unchanged, and refuses the first
// request that claims another node.
func TestRPCGuardPassesItsNodesRequestsAndNoOthers(t *testing.T) {
	stream := appendStream(t, 3, 4, 100)
	g := newRPCGuard(readerConn{r: bytes.NewReader(stream)}, []string{"n2"}, nil, func(string) {})
	got, err := io.ReadAll(g)
	if err != nil || !bytes.Equal(got, stream) {
		t.Fatalf("read %d of %d bytes through the guard, equal %v, err %v", len(got), len(stream), bytes.Equal(got, stream), err)
	}
	refused := ""
	g = newRPCGuard(readerConn{r: bytes.NewReader(stream)}, []string{"n3"}, nil, func(r string) { refused = r })
	if _, err := io.ReadAll(g); err == nil || refused != closedWrongID {
		t.Fatalf("n2's requests read through a guard of n3: err %v, counted %q", err, refused)
	}
}

// BenchmarkRPCGuard: what the guard adds to raft's decoding of a batch of 512 entries
// of 256 bytes (go test -run - -bench RPCGuard ./node).
func BenchmarkRPCGuard(b *testing.B) {
	const count = 16
	stream := appendStream(b, count, 512, 256)
	b.Run("raft alone", func(b *testing.B) {
		b.SetBytes(int64(len(stream) / count))
		for range b.N / count {
			decodeAll(b, bytes.NewReader(stream), count)
		}
	})
	b.Run("through the guard", func(b *testing.B) {
		b.SetBytes(int64(len(stream) / count))
		for range b.N / count {
			decodeAll(b, newRPCGuard(readerConn{r: bytes.NewReader(stream)}, []string{"n2"}, nil, func(string) {}), count)
		}
	})
}
