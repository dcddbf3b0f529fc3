package idemkv

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestAsErrorDoesNotStutter: a server error made by wrapping a sentinel went on the
// wire as "idemkv: fenced: idemkv: fenced: fence 5 ...", and a client that wrapped it
// once more made it three times (issue 14, point 3).
func TestAsErrorDoesNotStutter(t *testing.T) {
	err := fmt.Errorf("%w: fence 5 is older than the current fence 7", ErrFenced)
	got := AsError(err).Error()
	if want := "idemkv: fenced: fence 5 is older than the current fence 7"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if strings.Count(got, "fenced") != 1 || !errors.Is(AsError(err), ErrFenced) {
		t.Fatalf("%q", got)
	}
	// Errors that do not start with their sentinel keep their whole message.
	other := fmt.Errorf("no leader yet: %w", ErrUnavailable)
	if got := AsError(other).Message; got != other.Error() {
		t.Fatalf("%q", got)
	}
}
