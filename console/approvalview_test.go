package console_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/idemkv/idemkv"
)

// What an approver reads is what the approval runs with: an effect holding U+202E
// showed the IBAN after it reversed on the approvals page and the record's. It is shown
// escaped, with a warning. And Approve and Deny are offered only while a decision can
// land: the record page of an approved approval offered both, and the API answered
// not_pending.
func TestApproverSeesTheEffectAsItRuns(t *testing.T) {
	f := start(t, 1, false)
	f.awaiting(t, "order-17:payout", "Pay out to the customer's IBAN", map[string]any{"iban": "DE89\u202e9876-5432\u202c", "eur": 40})
	rec := f.awaiting(t, "order-18:refund", "Refund 40 EUR", map[string]any{"order": 18})
	if _, err := f.admin.DecideApproval(context.Background(), &idemkv.DecideApprovalRequest{Tenant: tenant, Key: rec.Key,
		ApprovalID: rec.Approval.ID, Fingerprint: rec.Fingerprint, Decision: idemkv.VerdictApprove, Approver: "ops"}); err != nil {
		t.Fatal(err)
	}
	c := browserLike(t)
	if resp := post(t, c, f.url(0, "/ui/login"), url.Values{"token": {approverToken}}, nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: %d", resp.StatusCode)
	}
	for _, page := range []string{"/ui/approvals?tenant=" + tenant, "/ui/record?tenant=" + tenant + "&key=order-17:payout"} {
		_, body := getPage(t, c, f.url(0, page))
		if strings.ContainsRune(body, '\u202e') || strings.ContainsRune(body, '\u202c') {
			t.Errorf("%s shows the effect with a raw U+202E or U+202C", page)
		}
		if !strings.Contains(body, `DE89\u202e9876-5432\u202c`) || !strings.Contains(body, "hidden-chars") {
			t.Errorf("%s does not show the escapes and the warning", page)
		}
		if !strings.Contains(body, `class="decide"`) {
			t.Errorf("%s offers no decision on a waiting approval", page)
		}
	}
	_, body := getPage(t, c, f.url(0, "/ui/record?tenant="+tenant+"&key=order-18:refund"))
	if strings.Contains(body, `class="decide"`) {
		t.Error("the record page offers Approve and Deny on an approved approval")
	}
	if !strings.Contains(body, "approved · "+rec.Approval.ID) || strings.Contains(body, "hidden-chars") {
		t.Error("the record page of the approved approval: no state, or a warning about nothing")
	}
}
