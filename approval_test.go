package idemkv

import (
	"strings"
	"testing"
)

// A client that lost a decision's answer knows the decision on record is its own by
// the name it sent: whatever token recorded it, and however clipped, the name matches;
// another name does not.
func TestApproverNamedMatchesWhatIsRecorded(t *testing.T) {
	long := strings.Repeat("é", 64)
	for _, c := range []struct{ named, token string }{
		{"ana", ""}, {"ana", "ana (approver)"}, {"cfo-alice", "ana (approver)"},
		{"alice", "approvals bot via slack (approver)"}, {long, "ana (approver)"},
		{"bob via phone", "bot (admin)"},
	} {
		rec := RecordedApprover(c.named, c.token)
		if !ApproverNamed(rec, c.named) {
			t.Errorf("%q recorded as %q is not recognised", c.named, rec)
		}
		for _, other := range []string{"anabelle", "an", "bob", "ana (approver)x", strings.Repeat("é", 10) + "x"} {
			if other != c.named && !strings.HasPrefix(c.named, other) && ApproverNamed(rec, other) {
				t.Errorf("%q recorded as %q is taken for %q", c.named, rec, other)
			}
		}
	}
}
