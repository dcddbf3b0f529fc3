package console_test

import (
	"context"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/idemkv/idemkv"
)

// TestBrowserReleasedRecordShowsItsHistory: an in-doubt record resolved not executed
// is gone, but its record page says it was released and shows what happened (execute,
// doubt, and the resolve by the admin's token), not an error. Once the key is
// reserved again, the page shows the new record, whose history continues the old one.
func TestBrowserReleasedRecordShowsItsHistory(t *testing.T) {
	f := start(t, 1, false)
	ctx := tab(t)
	rec := f.inDoubt(t, "order-19", "refund")
	if _, err := f.admin.Resolve(context.Background(), &idemkv.ResolveRequest{Tenant: tenant, Key: "order-19",
		Fingerprint: rec.Fingerprint, Outcome: idemkv.ResolveNotExecuted}); err != nil {
		t.Fatal(err)
	}
	events := func() string {
		return strings.Join(eval[[]string](t, ctx, `[...document.querySelectorAll("#history tr.event td:nth-child(2)")].map(c => c.textContent.trim())`), ",")
	}
	login(t, ctx, f, 0, adminToken, "ops-admin")
	do(t, ctx, chromedp.Navigate(f.url(0, "/ui/record?tenant=acme&key=order-19")), chromedp.WaitVisible(chromedp.CSS("#history")))
	if n := eval[int](t, ctx, `document.querySelectorAll("#error").length`); n != 0 {
		t.Fatalf("the released key's page shows an error: %s", text(t, ctx, "#error"))
	}
	mustContain(t, "status of a released key", text(t, ctx, "#status"), "released at")
	mustContain(t, "tool of a released key", text(t, ctx, "#tool"), "refund")
	if got := events(); got != "execute,doubt,resolve" {
		t.Fatalf("history of the released order-19: %q", got)
	}
	last := text(t, ctx, "#history tr.event:last-child")
	mustContain(t, "the resolve names who", last, "ops-admin")
	mustContain(t, "the resolve says how", last, "not executed")
	shot(t, ctx, "record-released-history")

	res, err := f.admin.Reserve(context.Background(), &idemkv.ReserveRequest{Tenant: tenant, Key: "order-19", Tool: "refund",
		Actor: "agent-8", Fingerprint: rec.Fingerprint})
	if err != nil || res.Decision != idemkv.DecisionExecute {
		t.Fatalf("reserve again: %v %+v", err, res)
	}
	do(t, ctx, chromedp.Navigate(f.url(0, "/ui/record?tenant=acme&key=order-19")), chromedp.WaitVisible(chromedp.CSS("#history")))
	mustContain(t, "status of the new record", text(t, ctx, "#status"), "pending")
	if got := events(); got != "execute,doubt,resolve,execute" {
		t.Fatalf("history of the new order-19: %q", got)
	}
	mustContain(t, "the new execute names its actor", text(t, ctx, "#history tr.event:last-child"), "agent-8")

	// A key never reserved is still the plain not_found.
	do(t, ctx, chromedp.Navigate(f.url(0, "/ui/record?tenant=acme&key=never")), chromedp.WaitVisible(chromedp.CSS("#error")))
	mustContain(t, "a key never reserved", text(t, ctx, "#error"), "not_found")
}
