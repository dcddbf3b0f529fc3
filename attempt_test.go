package idemkv_test

import (
	"regexp"
	"testing"

	"github.com/idemkv/idemkv"
)

// The shape is user-visible (records, logs) and shared with the Python and TypeScript
// clients, so a change to it must be deliberate.
func TestNewAttemptIDShape(t *testing.T) {
	shape := regexp.MustCompile(`^att_[0-9a-f]{24}$`)
	seen := map[string]bool{}
	for range 100 {
		id := idemkv.NewAttemptID()
		if !shape.MatchString(id) {
			t.Fatalf("NewAttemptID() = %q, want att_ and 24 hex digits", id)
		}
		if seen[id] {
			t.Fatalf("NewAttemptID() repeated %q within 100 calls", id)
		}
		seen[id] = true
	}
}
