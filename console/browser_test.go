package console_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemkv/idemkv"
)

const (
	hostileKey  = `<script>window.pwned=1</script>:order-66`
	hostileTool = `<img src=x onerror="window.pwned=2">`
)

// noMarkup checks that hostile text on the page stayed text: shown, and never run.
func noMarkup(t *testing.T, ctx context.Context, page, hostile string) {
	t.Helper()
	body := text(t, ctx, "body")
	mustContain(t, page+" shows the hostile text as text", body, hostile)
	if got := eval[string](t, ctx, "typeof window.pwned"); got != "undefined" {
		t.Fatalf("%s: a hostile key or tool ran as markup (window.pwned is %s)", page, got)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll("main script, main img").length`); n != 0 {
		t.Fatalf("%s: %d script or img elements in the page's content, want 0", page, n)
	}
}

// TestBrowserAdminSettlesInDoubt: an admin logs in, reads the overview, resolves one
// in-doubt record as committed and one (with a hostile key and tool) as not executed
// from the queue, reads a conflict, pages through a search and opens a record.
func TestBrowserAdminSettlesInDoubt(t *testing.T) {
	f := start(t, 1, false)
	ctx := tab(t)
	f.inDoubt(t, "order-17", "refund")
	f.inDoubt(t, hostileKey, hostileTool)

	login(t, ctx, f, 0, adminToken, "ops-admin")
	if got := text(t, ctx, "#in-doubt-count"); got != "2" {
		t.Fatalf("overview: in doubt %q, want 2", got)
	}
	mustContain(t, "overview nodes", text(t, ctx, "#nodes"), "leader")
	shot(t, ctx, "overview")

	do(t, ctx, chromedp.Navigate(f.url(0, "/ui/in-doubt")), chromedp.WaitVisible(chromedp.CSS("#records")))
	noMarkup(t, ctx, "in-doubt queue", hostileKey)
	mustContain(t, "in-doubt queue shows the hostile tool as text", text(t, ctx, "#records"), hostileTool)
	if n := eval[int](t, ctx, `document.querySelectorAll("tr.record").length`); n != 2 {
		t.Fatalf("in-doubt queue: %d rows, want 2", n)
	}
	shot(t, ctx, "in-doubt")

	// The oldest first: order-17.
	row := "tr.record:nth-of-type(1) "
	mustContain(t, "first row", text(t, ctx, row+"a.key"), "order-17")
	do(t, ctx,
		chromedp.SendKeys(chromedp.CSS(row+"form.resolve-committed input[name=remote_system]"), "stripe"),
		chromedp.SendKeys(chromedp.CSS(row+"form.resolve-committed input[name=remote_id]"), "re_3PzX17"),
	)
	submit(t, ctx, row+"form.resolve-committed button")
	mustContain(t, "flash after resolve", text(t, ctx, "#flash"), "as committed: stripe re_3PzX17")
	rec, err := f.get(t, "order-17")
	if err != nil || rec.Status != idemkv.StatusCommitted || rec.Receipt == nil || rec.Receipt.RemoteID != "re_3PzX17" {
		t.Fatalf("order-17 after resolve: %v %+v", err, rec)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll("tr.record").length`); n != 1 {
		t.Fatalf("in-doubt queue after a resolve: %d rows, want 1", n)
	}
	shot(t, ctx, "in-doubt-resolved-committed")

	do(t, ctx,
		chromedp.Click(chromedp.CSS(row+"form.resolve-not-executed input[name=confirm]")),
	)
	submit(t, ctx, row+"form.resolve-not-executed button")
	mustContain(t, "flash after not executed", text(t, ctx, "#flash"), "as not executed")
	noMarkup(t, ctx, "flash naming the hostile key", hostileKey)
	if _, err := f.get(t, hostileKey); !errors.Is(err, idemkv.ErrNotFound) {
		t.Fatalf("hostile key after a not-executed resolve: %v, want not found (released)", err)
	}
	mustContain(t, "empty queue", text(t, ctx, "#empty"), "Nothing in doubt")
	shot(t, ctx, "in-doubt-empty")

	// A conflict answered by this node against a record that keeps its effect (a
	// server-side rule, with a masked secret): the page shows the fields that differ.
	bg := context.Background()
	no := false
	if _, err := f.admin.SetApprovalRule(bg, &idemkv.SetApprovalRuleRequest{ApprovalRule: idemkv.ApprovalRule{
		Tenant: tenant, Tool: "create_ticket", RequireApproval: &no, StoreEffect: true, Mask: []string{"/api_key"}}}); err != nil {
		t.Fatal(err)
	}
	first := map[string]any{"title": "Disk full", "severity": 2, "api_key": "sk-live-1", "<script>window.pwned=3</script>": "x"}
	res, err := f.admin.Reserve(bg, &idemkv.ReserveRequest{Tenant: tenant, Key: "ticket-5", Tool: "create_ticket", Effect: effect(first)})
	if err != nil || res.Decision != idemkv.DecisionExecute {
		t.Fatalf("reserve: %v %+v", err, res)
	}
	if _, err := f.admin.Commit(bg, &idemkv.CommitRequest{Tenant: tenant, Key: "ticket-5", Fingerprint: res.Record.Fingerprint, Fence: res.Fence, RemoteSystem: "linear", RemoteID: "LIN-1842"}); err != nil {
		t.Fatal(err)
	}
	second := map[string]any{"title": "Disk full", "severity": 1, "api_key": "sk-live-2", "<script>window.pwned=3</script>": "y"}
	conflict, err := f.admin.Reserve(bg, &idemkv.ReserveRequest{Tenant: tenant, Key: "ticket-5", Tool: "create_ticket", Effect: effect(second)})
	if err != nil || conflict.Decision != idemkv.DecisionConflict || len(conflict.Conflict.Diff) == 0 {
		t.Fatalf("second reserve: %v %+v", err, conflict)
	}
	do(t, ctx, chromedp.Navigate(f.url(0, "/ui/conflicts")), chromedp.WaitVisible(chromedp.CSS("article.conflict")))
	c := text(t, ctx, "article.conflict")
	mustContain(t, "conflict", c, "ticket-5")
	mustContain(t, "conflict stored fingerprint", c, conflict.Conflict.ExistingFingerprint)
	mustContain(t, "conflict received fingerprint", c, conflict.Conflict.ReceivedFingerprint)
	mustContain(t, "conflict remote id", c, "LIN-1842")
	mustContain(t, "conflict page says where it comes from", text(t, ctx, "#source"), "this node")
	rows := eval[[][]string](t, ctx, `[...document.querySelectorAll("article.conflict tr.field")].map(r => [...r.cells].map(c => c.textContent.trim()))`)
	want := map[string][2]string{"/severity": {"2", "1"}, "/~0script>window.pwned=3~0/script>": {`"x"`, `"y"`}}
	got := map[string][2]string{}
	for _, r := range rows {
		got[r[0]] = [2]string{r[1], r[2]}
	}
	for path, w := range want {
		if path == "/~0script>window.pwned=3~0/script>" {
			// JSON Pointer escapes only "~" and "/": the key's "/" is "~1".
			path = "/<script>window.pwned=3<~1script>"
		}
		if got[path] != w {
			t.Errorf("diff row %s: %q, want %q (rows %q)", path, got[path], w, rows)
		}
	}
	if s, ok := got["/api_key"]; ok && (s[0] != `"***"` || s[1] != `"***"`) {
		t.Errorf("the masked secret shows as %q", s)
	}
	if strings.Contains(c, "sk-live") {
		t.Error("the conflict page shows a masked secret")
	}
	noMarkup(t, ctx, "conflicts", "/<script>window.pwned=3<~1script>")
	shot(t, ctx, "conflicts")

	// Search and paging: 55 records under one prefix are two pages.
	for i := range 55 {
		if _, err := f.admin.Reserve(bg, &idemkv.ReserveRequest{Tenant: tenant, Key: fmt.Sprintf("batch-%03d", i), Tool: "send_email", Effect: effect(map[string]any{"n": i})}); err != nil {
			t.Fatal(err)
		}
	}
	do(t, ctx,
		chromedp.Navigate(f.url(0, "/ui/records")),
		chromedp.WaitVisible(chromedp.CSS("#search")),
		chromedp.SendKeys(chromedp.CSS("#tenant"), tenant),
		chromedp.SendKeys(chromedp.CSS("#prefix"), "batch-"),
		chromedp.Click(chromedp.CSS("#find")),
		chromedp.WaitVisible(chromedp.CSS("#records")),
	)
	if n := eval[int](t, ctx, `document.querySelectorAll("tr.record").length`); n != 50 {
		t.Fatalf("search page 1: %d rows, want 50", n)
	}
	shot(t, ctx, "search-page-1")
	do(t, ctx, chromedp.Click(chromedp.CSS("#next")), chromedp.WaitVisible(chromedp.CSS("#records")))
	if n := eval[int](t, ctx, `document.querySelectorAll("tr.record").length`); n != 5 {
		t.Fatalf("search page 2: %d rows, want 5", n)
	}
	mustContain(t, "page 2 starts after page 1", text(t, ctx, "tr.record a.key"), "batch-050")
	shot(t, ctx, "search-page-2")

	do(t, ctx, chromedp.Click(chromedp.CSS("tr.record a.key")), chromedp.WaitVisible(chromedp.CSS("#record")))
	if got := text(t, ctx, "#key"); got != "batch-050" {
		t.Fatalf("record page key %q", got)
	}
	mustContain(t, "record status", text(t, ctx, "#status"), "pending")
	shot(t, ctx, "record")

	// The committed record's page shows the receipt.
	do(t, ctx, chromedp.Navigate(f.url(0, "/ui/record?tenant=acme&key=order-17")), chromedp.WaitVisible(chromedp.CSS("#receipt")))
	mustContain(t, "receipt", text(t, ctx, "#receipt"), "stripe re_3PzX17")
	events := eval[[]string](t, ctx, `[...document.querySelectorAll("#history tr.event td:nth-child(2)")].map(c => c.textContent.trim())`)
	if strings.Join(events, ",") != "execute,doubt,resolve" {
		t.Fatalf("history of order-17: %q, want execute, doubt, resolve", events)
	}
	mustContain(t, "the resolve names who", text(t, ctx, "#history tr.event:last-child"), "ops-admin")
	shot(t, ctx, "record-committed-history")

	do(t, ctx, chromedp.Click(chromedp.CSS("#logout")), chromedp.WaitVisible(chromedp.CSS("#token")))
	do(t, ctx, chromedp.Navigate(f.url(0, "/ui/in-doubt")), chromedp.WaitVisible(chromedp.CSS("#token")))
	shot(t, ctx, "login")
}

// postFromPage posts a console form from inside the page, with the session's CSRF
// token, the way a crafted form would.
func postFromPage(t *testing.T, ctx context.Context, path string, fields map[string]string) {
	t.Helper()
	var b strings.Builder
	b.WriteString(`(async () => { const p = new URLSearchParams(); p.set("csrf", document.querySelector("input[name=csrf]").value);`)
	for k, v := range fields {
		fmt.Fprintf(&b, "p.set(%q, %q);", k, v)
	}
	fmt.Fprintf(&b, `const r = await fetch(%q, {method: "POST", body: p, redirect: "manual"}); return r.type; })()`, path)
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	typ, err := chromedp.Run(sctx, chromedp.Evaluate[string](b.String(), chromedp.EvalAsValue, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("posting %s: %v", path, err)
	}
	// The console answers a form it took with a redirect (a refused CSRF check is a
	// 403 page instead); the redirect is left unfollowed so that the flash waits for
	// the next page.
	if typ != "opaqueredirect" {
		t.Fatalf("posting %s: answer of type %q, want the console's redirect", path, typ)
	}
}

// TestBrowserApproverAndMonitor: an approver approves one refund and denies another
// from the approvals queue and cannot resolve; a monitor reads the overview and
// cannot resolve either.
func TestBrowserApproverAndMonitor(t *testing.T) {
	f := start(t, 1, false)
	f.awaiting(t, "refund-17", "Refund 40 EUR to order 17", map[string]any{"amount": "40.00", "currency": "EUR", "order": 17})
	f.awaiting(t, "refund-18", "<b>Refund</b> 900 EUR to order 18", map[string]any{"amount": "900.00", "currency": "EUR", "order": 18})
	stuck := f.inDoubt(t, "stuck-1", "wire_transfer")

	ctx := tab(t)
	login(t, ctx, f, 0, approverToken, "alice-approver")
	if got := text(t, ctx, "#role"); got != "approver" {
		t.Fatalf("role %q", got)
	}
	do(t, ctx, chromedp.Navigate(f.url(0, "/ui/approvals")), chromedp.WaitVisible(chromedp.CSS("article.approval")))
	if n := eval[int](t, ctx, `document.querySelectorAll("article.approval").length`); n != 2 {
		t.Fatalf("approvals: %d cards, want 2", n)
	}
	first := "article.approval:nth-of-type(1) "
	mustContain(t, "summary", text(t, ctx, first+".summary"), "Refund 40 EUR to order 17")
	mustContain(t, "effect", text(t, ctx, first+"pre.effect"), `"amount": "40.00"`)
	second := text(t, ctx, "article.approval:nth-of-type(2) .summary")
	if second != "<b>Refund</b> 900 EUR to order 18" {
		t.Fatalf("a summary with markup shows as %q, want the text itself", second)
	}
	shot(t, ctx, "approvals")

	do(t, ctx,
		chromedp.SendKeys(chromedp.CSS(first+"input[name=reason]"), "checked with finance"),
	)
	submit(t, ctx, first+"button.approve")
	mustContain(t, "flash after approve", text(t, ctx, "#flash"), "Approved “refund-17” of tenant acme as alice-approver")
	rec, err := f.get(t, "refund-17")
	if err != nil || rec.Approval == nil || rec.Approval.State != idemkv.ApprovalApproved || rec.Approval.Approver != "alice-approver (approver)" || rec.Approval.Reason != "checked with finance" {
		t.Fatalf("refund-17 after approve: %v %+v", err, rec)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll("article.approval").length`); n != 1 {
		t.Fatalf("approvals after one approve: %d cards, want 1", n)
	}
	shot(t, ctx, "approvals-approved")

	do(t, ctx,
		chromedp.SendKeys(chromedp.CSS(first+"input[name=reason]"), "over the limit"),
	)
	submit(t, ctx, first+"button.deny")
	mustContain(t, "flash after deny", text(t, ctx, "#flash"), "Denied “refund-18”")
	rec, err = f.get(t, "refund-18")
	if err != nil || rec.Approval == nil || rec.Approval.State != idemkv.ApprovalDenied || rec.Approval.Reason != "over the limit" {
		t.Fatalf("refund-18 after deny: %v %+v", err, rec)
	}
	mustContain(t, "empty approvals", text(t, ctx, "#empty"), "No approvals waiting")
	do(t, ctx, chromedp.Navigate(f.url(0, "/ui/record?tenant=acme&key=refund-18")), chromedp.WaitVisible(chromedp.CSS("#approval")))
	mustContain(t, "record of the denied refund", text(t, ctx, "#approval"), "denied")
	mustContain(t, "record of the denied refund", text(t, ctx, "#approval"), "by alice-approver")
	events := eval[[]string](t, ctx, `[...document.querySelectorAll("#history tr.event td:nth-child(2)")].map(c => c.textContent.trim())`)
	if strings.Join(events, ",") != "approval_requested,approval_decided" {
		t.Fatalf("history of refund-18: %q", events)
	}
	mustContain(t, "the decision's event names the approver", text(t, ctx, "#history tr.event:last-child"), "alice-approver")
	shot(t, ctx, "record-denied")

	// The approver may read the in-doubt record but not resolve it: the console offers
	// no form, and a crafted one is refused by the API.
	do(t, ctx, chromedp.Navigate(f.url(0, "/ui/record?tenant=acme&key=stuck-1")), chromedp.WaitVisible(chromedp.CSS("#record")))
	if n := eval[int](t, ctx, `document.querySelectorAll("form.resolve-committed").length`); n != 0 {
		t.Fatalf("the approver's record page offers %d resolve forms", n)
	}
	resolve := map[string]string{"tenant": tenant, "key": "stuck-1", "fingerprint": stuck.Fingerprint, "outcome": "not_executed", "confirm": "yes", "next": "/ui/approvals"}
	postFromPage(t, ctx, "/ui/in-doubt/resolve", resolve)
	do(t, ctx, chromedp.Navigate(f.url(0, "/ui/approvals")), chromedp.WaitVisible(chromedp.CSS("#flash")))
	mustContain(t, "approver's resolve", text(t, ctx, "#flash"), "permission_denied")
	shot(t, ctx, "approver-resolve-refused")
	if rec, err := f.get(t, "stuck-1"); err != nil || !rec.InDoubt {
		t.Fatalf("stuck-1 after the approver's resolve: %v %+v", err, rec)
	}

	mon := tab(t)
	login(t, mon, f, 0, monitorToken, "grafana")
	if got := text(t, mon, "#in-doubt-count"); got != "1" {
		t.Fatalf("monitor's overview: in doubt %q, want 1", got)
	}
	mustContain(t, "monitor's decisions", text(t, mon, "#tools"), "refund")
	shot(t, mon, "overview-monitor")
	do(t, mon, chromedp.Navigate(f.url(0, "/ui/in-doubt")), chromedp.WaitVisible(chromedp.CSS("#tenant")))
	postFromPage(t, mon, "/ui/in-doubt/resolve", resolve)
	do(t, mon, chromedp.Navigate(f.url(0, "/ui/in-doubt?tenant=acme")), chromedp.WaitVisible(chromedp.CSS("#flash")))
	mustContain(t, "monitor's resolve", text(t, mon, "#flash"), "permission_denied")
	mustContain(t, "monitor's in-doubt list", text(t, mon, "#error"), "permission_denied")
	shot(t, mon, "monitor-refused")
	if rec, err := f.get(t, "stuck-1"); err != nil || !rec.InDoubt {
		t.Fatalf("stuck-1 after the monitor's resolve: %v %+v", err, rec)
	}
}

// TestBrowserThreeNodes: on a follower's console an admin sees the three members and
// settles an in-doubt record and an approval (the follower's API forwards both to the
// leader); the leader's console shows the conflict it answered.
func TestBrowserThreeNodes(t *testing.T) {
	f := start(t, 3, false)
	leader := f.c.LeaderIndex(t)
	follower := (leader + 1) % 3
	f.inDoubt(t, "charge-1", "charge_card")
	f.awaiting(t, "refund-1", "Refund 12 EUR", map[string]any{"amount": "12.00"})

	ctx := tab(t)
	login(t, ctx, f, follower, adminToken, "ops-admin")
	if n := eval[int](t, ctx, `document.querySelectorAll("#nodes tbody tr").length`); n != 3 {
		t.Fatalf("overview: %d nodes, want 3", n)
	}
	nodes := text(t, ctx, "#nodes")
	for i := range 3 {
		mustContain(t, "overview nodes", nodes, f.c.Endpoint(i))
	}
	mustContain(t, "leader", text(t, ctx, "#leader"), f.c.ID(leader))
	if n := eval[int](t, ctx, `[...document.querySelectorAll("#nodes tbody tr")].filter(r => r.cells[9].textContent.trim() === "" && /^\d+$/.test(r.cells[5].textContent.trim())).length`); n != 3 {
		t.Fatalf("overview: %d nodes with an applied index and no error, want 3", n)
	}
	shot(t, ctx, "cluster-overview")

	do(t, ctx, chromedp.Navigate(f.url(follower, "/ui/in-doubt")), chromedp.WaitVisible(chromedp.CSS("tr.record")))
	do(t, ctx,
		chromedp.SendKeys(chromedp.CSS("form.resolve-committed input[name=remote_system]"), "adyen"),
		chromedp.SendKeys(chromedp.CSS("form.resolve-committed input[name=remote_id]"), "PSP-881"),
	)
	submit(t, ctx, "form.resolve-committed button")
	mustContain(t, "resolve on a follower", text(t, ctx, "#flash"), "as committed: adyen PSP-881")
	if rec, err := f.get(t, "charge-1"); err != nil || rec.Status != idemkv.StatusCommitted {
		t.Fatalf("charge-1: %v %+v", err, rec)
	}
	shot(t, ctx, "cluster-in-doubt-resolved")
	do(t, ctx, chromedp.Navigate(f.url(follower, "/ui/record?tenant=acme&key=charge-1")), chromedp.WaitVisible(chromedp.CSS("#history")))
	if events := eval[[]string](t, ctx, `[...document.querySelectorAll("#history tr.event td:nth-child(2)")].map(c => c.textContent.trim())`); strings.Join(events, ",") != "execute,doubt,resolve" {
		t.Fatalf("history of charge-1 on a follower: %q", events)
	}
	shot(t, ctx, "cluster-record-history")

	do(t, ctx, chromedp.Navigate(f.url(follower, "/ui/approvals?tenant=acme")), chromedp.WaitVisible(chromedp.CSS("article.approval")))
	submit(t, ctx, "button.approve")
	mustContain(t, "approve on a follower", text(t, ctx, "#flash"), "Approved “refund-1”")
	if rec, err := f.get(t, "refund-1"); err != nil || rec.Approval.State != idemkv.ApprovalApproved || rec.Approval.Approver != "ops-admin (admin)" {
		t.Fatalf("refund-1: %v %+v", err, rec)
	}
	shot(t, ctx, "cluster-approved")

	bg := context.Background()
	if _, err := f.admin.Reserve(bg, &idemkv.ReserveRequest{Tenant: tenant, Key: "refund-1", Tool: "refund", Effect: effect(map[string]any{"amount": "13.00"})}); err != nil {
		t.Fatal(err)
	}
	// Another node's console asks for its own login, and the follower's session stays.
	login(t, ctx, f, leader, adminToken, "ops-admin")
	do(t, ctx, chromedp.Navigate(f.url(leader, "/ui/conflicts")), chromedp.WaitVisible(chromedp.CSS("article.conflict")))
	mustContain(t, "leader's conflicts", text(t, ctx, "article.conflict"), "refund-1")
	shot(t, ctx, "cluster-conflicts")
	do(t, ctx, chromedp.Navigate(f.url(follower, "/ui/conflicts")), chromedp.WaitVisible(chromedp.CSS("#who")))
	mustContain(t, "the follower's ring", text(t, ctx, "#empty"), "No conflicts answered by this node")
}
