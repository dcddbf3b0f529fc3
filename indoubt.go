package idemkv

import (
	"cmp"
	"strconv"
	"strings"
)

// DoubtPosition places an in-doubt record in the order GET /v1/in-doubt lists every
// tenant's in-doubt records: oldest in_doubt_since first, then tenant, then key, so that
// the order is total and a page ends at one exact place. Its String is that listing's
// cursor (the next of a page, the after of the next one).
type DoubtPosition struct {
	Since  Timestamp
	Tenant string
	Key    string
}

// DoubtPositionOf returns where rec stands in that order.
func DoubtPositionOf(rec *Record) DoubtPosition {
	return DoubtPosition{Since: rec.InDoubtSince, Tenant: rec.Tenant, Key: rec.Key}
}

// Compare orders p before q (-1), with it (0) or after it (+1).
func (p DoubtPosition) Compare(q DoubtPosition) int {
	return cmp.Or(cmp.Compare(p.Since, q.Since), strings.Compare(p.Tenant, q.Tenant), strings.Compare(p.Key, q.Key))
}

// String is the cursor "<in_doubt_since in Unix ms>/<tenant>/<key>". A tenant holds no
// "/", so the key is everything after the second one.
func (p DoubtPosition) String() string {
	return strconv.FormatInt(int64(p.Since), 10) + "/" + p.Tenant + "/" + p.Key
}

// ParseDoubtPosition reads a cursor written by DoubtPosition.String. It refuses, as an
// invalid "after", anything String cannot have written of a stored record.
func ParseDoubtPosition(s string) (DoubtPosition, error) {
	bad := func() (DoubtPosition, error) {
		return DoubtPosition{}, Invalid("after", "after must be the next of an earlier page of GET /v1/in-doubt (<in_doubt_since ms>/<tenant>/<key>)")
	}
	since, rest, ok := strings.Cut(s, "/")
	if !ok {
		return bad()
	}
	tenant, key, ok := strings.Cut(rest, "/")
	if !ok {
		return bad()
	}
	ms, err := strconv.ParseInt(since, 10, 64)
	if err != nil || ms < 0 || strconv.FormatInt(ms, 10) != since {
		return bad()
	}
	if ValidTenant(tenant) != nil || ValidKey(key) != nil {
		return bad()
	}
	return DoubtPosition{Since: Timestamp(ms), Tenant: tenant, Key: key}, nil
}
