package wire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math"
	"strings"
	"testing"
)

var errSentinel = errors.New("sentinel")

func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		enc  func([]byte) []byte
		dec  func(*Decoder) any
		want any
		hex  string // exact layout: callers' stored data depends on it
	}{
		{"uvarint zero", func(b []byte) []byte { return AppendUvarint(b, 0) }, func(d *Decoder) any { return d.Uvarint() }, uint64(0), "00"},
		{"uvarint max", func(b []byte) []byte { return AppendUvarint(b, math.MaxUint64) }, func(d *Decoder) any { return d.Uvarint() }, uint64(math.MaxUint64), "ffffffffffffffffff01"},
		{"varint negative", func(b []byte) []byte { return AppendVarint(b, -5) }, func(d *Decoder) any { return d.Varint() }, int64(-5), "09"},
		{"varint min", func(b []byte) []byte { return AppendVarint(b, math.MinInt64) }, func(d *Decoder) any { return d.Varint() }, int64(math.MinInt64), "ffffffffffffffffff01"},
		{"string", func(b []byte) []byte { return AppendString(b, "ü✓") }, func(d *Decoder) any { return d.Text() }, "ü✓", "05c3bce29c93"},
		{"empty string", func(b []byte) []byte { return AppendString(b, "") }, func(d *Decoder) any { return d.Text() }, "", "00"},
		{"bytes", func(b []byte) []byte { return AppendBytes(b, []byte{0, 1, 2}) }, func(d *Decoder) any { return d.Bytes() }, []byte{0, 1, 2}, "03000102"},
		{"empty bytes decode nil", func(b []byte) []byte { return AppendBytes(b, []byte{}) }, func(d *Decoder) any { return d.Bytes() }, []byte(nil), "00"},
		{"raw", func(b []byte) []byte { return AppendBytes(b, []byte("ab")) }, func(d *Decoder) any { return d.Raw() }, []byte("ab"), "026162"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := tt.enc([]byte("pre"))
			if string(b[:3]) != "pre" {
				t.Fatalf("append overwrote dst: %q", b)
			}
			if got := hex.EncodeToString(b[3:]); got != tt.hex {
				t.Fatalf("encoding = %s, want %s", got, tt.hex)
			}
			d := NewDecoder(b[3:], errSentinel)
			got := tt.dec(&d)
			if err := d.Finish(); err != nil {
				t.Fatal(err)
			}
			if gb, ok := got.([]byte); ok {
				wb := tt.want.([]byte)
				if !bytes.Equal(gb, wb) || (gb == nil) != (wb == nil) {
					t.Fatalf("decoded %#v, want %#v", gb, wb)
				}
				return
			}
			if got != tt.want {
				t.Fatalf("decoded %#v, want %#v", got, tt.want)
			}
		})
	}
}

func TestBytesCopies(t *testing.T) {
	in := AppendBytes(nil, []byte("xyz"))
	d := NewDecoder(in, nil)
	got := d.Bytes()
	in[1] = 'q'
	if string(got) != "xyz" {
		t.Fatalf("Bytes aliases its input: %q", got)
	}
}

func TestErrors(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		read func(*Decoder)
		msg  string
	}{
		{"byte from nothing", nil, func(d *Decoder) { d.Byte() }, "truncated"},
		{"truncated uvarint", []byte{0x80}, func(d *Decoder) { d.Uvarint() }, "bad uvarint: truncated"},
		{"uvarint overflow", bytes.Repeat([]byte{0xff}, 11), func(d *Decoder) { d.Uvarint() }, "bad uvarint: overflows 64 bits"},
		{"truncated varint", nil, func(d *Decoder) { d.Varint() }, "bad varint: truncated"},
		{"varint overflow", bytes.Repeat([]byte{0xff}, 11), func(d *Decoder) { d.Varint() }, "bad varint: overflows 64 bits"},
		{"truncated string", []byte{3, 'a', 'b'}, func(d *Decoder) { _ = d.Text() }, "length 3 exceeds the 2 bytes left"},
		{"oversized length", AppendUvarint(nil, math.MaxUint64), func(d *Decoder) { d.Bytes() }, "exceeds the 0 bytes left"},
		{"oversized length beyond int", append(AppendUvarint(nil, 1<<63), 'x'), func(d *Decoder) { d.Raw() }, "length 9223372036854775808 exceeds the 1 bytes left"},
		{"trailing bytes", []byte{1, 2, 3}, func(d *Decoder) { d.Byte() }, "2 trailing bytes"},
		{"caller failure", []byte{7}, func(d *Decoder) { d.Fail("code %d unknown", d.Byte()) }, "code 7 unknown"},
		{"first error sticks", []byte{5}, func(d *Decoder) { _ = d.Text(); d.Fail("later") }, "length 5 exceeds the 0 bytes left"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDecoder(tt.in, errSentinel)
			tt.read(&d)
			err := d.Finish()
			if !errors.Is(err, errSentinel) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("err = %v, want one wrapping the sentinel and containing %q", err, tt.msg)
			}
			// Once failed, every read is a zero value and the error does not change.
			if d.Byte() != 0 || d.Uvarint() != 0 || d.Varint() != 0 || d.Raw() != nil || d.Text() != "" || d.Bytes() != nil {
				t.Fatal("a read after an error returned a non-zero value")
			}
			if d.Err() != err {
				t.Fatalf("error changed from %v to %v", err, d.Err())
			}
		})
	}
}

func TestNilSentinel(t *testing.T) {
	d := NewDecoder(nil, nil)
	d.Byte()
	if err := d.Err(); err == nil || err.Error() != "truncated" {
		t.Fatalf("err = %v, want plain \"truncated\"", err)
	}
}
