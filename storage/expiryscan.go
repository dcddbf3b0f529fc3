package storage

import (
	"bytes"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/idemkv/idemkv"
)

// Scans of the two expiry indexes (expiryIndex: the records', x/, and the tombstones',
// y/), each from just after its own swept mark.

func scanExpired(r pebble.Reader, now idemkv.Timestamp, limit int, fn func(ExpiryEntry)) error {
	return recordExpiry.scan(r, now, limit, fn)
}

// scan calls fn for up to limit entries of x at or before now, earliest first, after
// x's swept mark.
func (x expiryIndex) scan(r pebble.Reader, now idemkv.Timestamp, limit int, fn func(ExpiryEntry)) error {
	if limit <= 0 {
		return nil
	}
	lower, err := x.sweptBound(r)
	if err != nil {
		return err
	}
	upper := x.bound(now)
	if bytes.Compare(lower, upper) >= 0 {
		return nil
	}
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return fmt.Errorf("storage: expiry scan: %w", err)
	}
	defer it.Close()
	n := 0
	for it.First(); it.Valid() && n < limit; it.Next() {
		e, err := parseExpiryKey(it.Key())
		if err != nil {
			return err
		}
		fn(e)
		n++
	}
	return it.Error()
}

// sweptBound is the first index key a scan must look at: the one right after the
// swept mark, or the start of the index.
func sweptBound(r pebble.Reader) ([]byte, error) { return recordExpiry.sweptBound(r) }

func (x expiryIndex) sweptBound(r pebble.Reader) ([]byte, error) {
	mark, err := getValue(r, x.mark)
	if err != nil || mark == nil {
		return []byte(x.prefix), err
	}
	if !bytes.HasPrefix(mark, []byte(x.prefix)) {
		return nil, fmt.Errorf("%w: swept mark %q", ErrCorrupt, mark)
	}
	if _, err := parseExpiryKey(mark); err != nil {
		return nil, fmt.Errorf("%w: swept mark %q", ErrCorrupt, mark)
	}
	// mark+"\x00" is the smallest key greater than mark.
	return append(mark, 0), nil
}
