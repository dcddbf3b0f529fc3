package auth_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/idemkv/idemkv/auth"
)

// FuzzParse feeds the token file parser hostile documents: it never panics, refuses
// only with ErrInvalidFile, and what it accepts is valid and means the same in JSON.
func FuzzParse(f *testing.F) {
	f.Add([]byte(yamlFile()))
	f.Add([]byte(`{"tokens":[{"name":"a","hash":"` + auth.HashToken("x") + `","role":"client","tenants":["acme","*"]}]}`))
	f.Add([]byte("tokens:\n  - {name: m, hash: " + auth.HashToken("y") + ", role: monitor}\n"))
	f.Add([]byte("tokens: &a [*a]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := auth.Parse(data)
		if err != nil {
			if !errors.Is(err, auth.ErrInvalidFile) {
				t.Fatalf("Parse(%q) failed with %v, want ErrInvalidFile", data, err)
			}
			return
		}
		if err := file.Validate(); err != nil {
			t.Fatalf("Parse accepted an invalid file %q: %v", data, err)
		}
		raw, err := json.Marshal(file)
		if err != nil {
			t.Fatal(err)
		}
		again, err := auth.Parse(raw)
		if err != nil || !reflect.DeepEqual(file, again) {
			t.Fatalf("%q parsed to %+v; its JSON %s parses to %+v, %v", data, file, raw, again, err)
		}
		if _, err := auth.New(file, nil); err != nil {
			t.Fatalf("New refused a parsed file: %v", err)
		}
	})
}
