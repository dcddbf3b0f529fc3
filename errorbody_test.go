package idemkv_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/idemkv/idemkv"
)

// What the server writes, the parser reads back to the same sentinel; anything else is
// not an idemkv error.
func TestErrorBodyRoundTrip(t *testing.T) {
	b, err := json.Marshal(idemkv.ErrorBody{Error: idemkv.AsError(idemkv.Errorf(idemkv.ErrFenced, "old fence"))})
	if err != nil {
		t.Fatal(err)
	}
	e := idemkv.ParseErrorBody(b)
	if e == nil || !errors.Is(e, idemkv.ErrFenced) || e.Code != idemkv.CodeFenced {
		t.Fatalf("parsed %s as %v", b, e)
	}
	for _, s := range []string{``, `<html>bad gateway</html>`, `{}`, `{"error":{}}`, `{"error":null}`} {
		if e := idemkv.ParseErrorBody([]byte(s)); e != nil {
			t.Errorf("%q parsed as %v", s, e)
		}
	}
}
