// Package wire holds the byte-level primitives shared by idemkv's binary formats, the
// Raft command codec in fsm and the Pebble record encoding in storage: single bytes,
// varints, uvarints, and uvarint-length-prefixed strings and byte slices, plus a
// Decoder whose first error sticks.
//
// What it must never do:
//
//   - Know anything about the formats built on it. Versions, ops, statuses, field order
//     and the meaning of a value belong to the callers; the only error identity here is
//     the sentinel a caller hands to NewDecoder.
//   - Change how a value is laid out. These bytes are already in Pebble and in Raft logs,
//     so a different layout is a format break for every caller; add a new function
//     instead.
//   - Panic, or allocate from a length it has not checked against the bytes it holds,
//     whatever the input: decoders read data written by older builds, by other nodes and
//     by fuzzers.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// AppendUvarint appends v as an unsigned varint (encoding/binary layout).
func AppendUvarint(dst []byte, v uint64) []byte { return binary.AppendUvarint(dst, v) }

// AppendVarint appends v as a zig-zag signed varint (encoding/binary layout).
func AppendVarint(dst []byte, v int64) []byte { return binary.AppendVarint(dst, v) }

// AppendString appends the uvarint length of s, then s.
func AppendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// AppendBytes appends the uvarint length of b, then b. A nil and an empty b encode
// alike.
func AppendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// Decoder consumes its input front to back. The first error sticks and turns every
// later read into a zero value, so a caller reads a whole field list straight through
// and checks Err (or Finish) once at the end.
//
// Every error it records wraps the sentinel given to NewDecoder.
type Decoder struct {
	b        []byte
	err      error
	sentinel error
}

// NewDecoder returns a Decoder over b whose errors wrap sentinel (which may be nil).
// Raw returns sub-slices of b; Text and Bytes copy.
func NewDecoder(b []byte, sentinel error) Decoder {
	return Decoder{b: b, sentinel: sentinel}
}

// Err returns the first error recorded, or nil.
func (d *Decoder) Err() error { return d.err }

// Len returns the number of bytes not yet consumed.
func (d *Decoder) Len() int { return len(d.b) }

// Fail records a failure described by format and args, wrapping the sentinel, unless
// an earlier error is already recorded. Callers use it to reject values that decoded
// but make no sense to them (an unknown code, a number out of range).
func (d *Decoder) Fail(format string, args ...any) {
	if d.err != nil {
		return
	}
	msg := fmt.Sprintf(format, args...)
	if d.sentinel == nil {
		d.err = errors.New(msg)
		return
	}
	d.err = fmt.Errorf("%w: %s", d.sentinel, msg)
}

// Finish records an error if any input is left unread and returns Err.
func (d *Decoder) Finish() error {
	if d.err == nil && len(d.b) != 0 {
		d.Fail("%d trailing bytes", len(d.b))
	}
	return d.err
}

// Byte consumes one byte.
func (d *Decoder) Byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.Fail("truncated")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

// Uvarint consumes an unsigned varint.
func (d *Decoder) Uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.failVarint("uvarint", n)
		return 0
	}
	d.b = d.b[n:]
	return v
}

// Varint consumes a signed varint.
func (d *Decoder) Varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.failVarint("varint", n)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *Decoder) failVarint(kind string, n int) {
	if n == 0 {
		d.Fail("bad %s: truncated", kind)
	} else {
		d.Fail("bad %s: overflows 64 bits", kind)
	}
}

// Raw consumes a uvarint length and that many bytes, and returns them without copying:
// the result aliases the Decoder's input. The length is checked against the bytes left
// before anything is sliced.
func (d *Decoder) Raw() []byte {
	n := d.Uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.Fail("length %d exceeds the %d bytes left", n, len(d.b))
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

// Text consumes a length-prefixed field as a string (a copy).
func (d *Decoder) Text() string { return string(d.Raw()) }

// Bytes consumes a length-prefixed field and returns a copy, or nil when the field is
// empty, so that an absent value stays absent after a round trip.
func (d *Decoder) Bytes() []byte {
	v := d.Raw()
	if len(v) == 0 {
		return nil
	}
	return append([]byte(nil), v...)
}
