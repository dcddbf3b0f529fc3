package node

import (
	"encoding/binary"
	"io"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft-wal/types"
)

// raft-wal reads an entry back (GetLog: the log verifier's read of every entry, a
// lagging follower's catch-up past Raft's log cache) with one 64 KiB pread at the
// entry's frame, in the hope that the frame fits: a frame is an 8-byte header (a type
// byte, three zero bytes, the payload's length, little-endian) and its payload. Ours
// are a few hundred bytes, so each read copied 64 KiB out of the page cache to use
// well under one: the verifier's read-back was 14% of a follower's CPU and 6% of the
// leader's at 64 clients.
//
// raft-wal's reader takes a read that stops early with io.EOF, at least a header long,
// as all there is (it is how a frame near a file's end is read) and uses it when the
// frame fits. So a wal file reads such a speculative read as a short one: it reads
// frameProbeBytes, and when they hold a whole entry frame it returns just that frame,
// with io.EOF; otherwise it reads all that was asked, as before. The bytes returned are
// the file's, read from it; only how many differs.
//
// The wal file recognises the speculative read by its length (walReadBufBytes, raft-wal's
// minBufSize) and by what it finds. raft-wal reads a frame that does not fit a second
// time, at the payload and as long as the header says; a payload of exactly 64 KiB is
// asked for with the same length, and its first bytes may look like a small frame's
// header. Such a read has its frame's header just before it: the wal file reads the 8
// bytes before every speculative read with it and reads in full when they are an
// entry header of the length asked. Reads raft-wal makes while it opens the log (its
// recovery of the last segment checks a batch's checksum with a read of any length)
// are always read in full: the files shorten reads only once the log is open (armed).

// walReadBufBytes is the length of raft-wal's speculative frame read (segment's
// minBufSize).
const walReadBufBytes = 64 << 10

// frameProbeBytes is how much of the file a speculative read reads first. A page:
// every entry this node writes is smaller, bar a command carrying a large result.
const frameProbeBytes = 4 << 10

// walFrameHeaderBytes is the length of raft-wal's frame header; walFrameEntry and
// walFrameIndex the types of an entry frame and of a sealed segment's index frame
// (raft-wal's segment/format.go).
const (
	walFrameHeaderBytes = 8
	walFrameEntry       = 1
	walFrameIndex       = 2
)

// probeBufs holds the buffers of probe reads: the 8 bytes before a read and
// frameProbeBytes of it.
var probeBufs = sync.Pool{New: func() any { return new([walFrameHeaderBytes + frameProbeBytes]byte) }}

// shortReadWALFS is a raft-wal filesystem whose files read a speculative frame read
// short (see above) once armed is set.
type shortReadWALFS struct {
	types.VFS
	armed *atomic.Bool
}

func (s shortReadWALFS) Create(dir, name string, size uint64) (types.WritableFile, error) {
	f, err := s.VFS.Create(dir, name, size)
	if err != nil {
		return nil, err
	}
	return shortReadWritable{f, s.armed}, nil
}

func (s shortReadWALFS) OpenWriter(dir, name string) (types.WritableFile, error) {
	f, err := s.VFS.OpenWriter(dir, name)
	if err != nil {
		return nil, err
	}
	return shortReadWritable{f, s.armed}, nil
}

func (s shortReadWALFS) OpenReader(dir, name string) (types.ReadableFile, error) {
	f, err := s.VFS.OpenReader(dir, name)
	if err != nil {
		return nil, err
	}
	return shortReadReadable{f, s.armed}, nil
}

type shortReadWritable struct {
	types.WritableFile
	armed *atomic.Bool
}

func (f shortReadWritable) ReadAt(p []byte, off int64) (int, error) {
	return readFrameAt(f.WritableFile, f.armed.Load(), p, off)
}

type shortReadReadable struct {
	types.ReadableFile
	armed *atomic.Bool
}

func (f shortReadReadable) ReadAt(p []byte, off int64) (int, error) {
	return readFrameAt(f.ReadableFile, f.armed.Load(), p, off)
}

// readFrameAt reads len(p) bytes of r at off, or, for a speculative frame read (armed,
// walReadBufBytes long) that finds a whole entry frame at off in its first
// frameProbeBytes, that frame alone with io.EOF.
func readFrameAt(r io.ReaderAt, armed bool, p []byte, off int64) (int, error) {
	if !armed || len(p) != walReadBufBytes || off < walFrameHeaderBytes {
		return r.ReadAt(p, off)
	}
	buf := probeBufs.Get().(*[walFrameHeaderBytes + frameProbeBytes]byte)
	defer probeBufs.Put(buf)
	n, err := r.ReadAt(buf[:], off-walFrameHeaderBytes)
	if err != nil || n != len(buf) {
		// An error, or the file's end within the probe: read as asked.
		return r.ReadAt(p, off)
	}
	before, at := buf[:walFrameHeaderBytes], buf[walFrameHeaderBytes:]
	if size, ok := entryFrameLen(before); ok && size == uint64(len(p)) {
		// Possibly the second read of a frame whose payload is exactly this long.
		return r.ReadAt(p, off)
	}
	size, ok := entryFrameLen(at)
	if !ok || walFrameHeaderBytes+size > uint64(len(at)) {
		// A commit or index frame, a corrupt header, or a frame longer than the probe.
		return r.ReadAt(p, off)
	}
	return copy(p, at[:walFrameHeaderBytes+size]), io.EOF
}

// entryFrameLen is the payload length in h when h is an entry frame's header.
func entryFrameLen(h []byte) (uint64, bool) {
	if h[0] != walFrameEntry || h[1] != 0 || h[2] != 0 || h[3] != 0 {
		return 0, false
	}
	return uint64(binary.LittleEndian.Uint32(h[4:walFrameHeaderBytes])), true
}
