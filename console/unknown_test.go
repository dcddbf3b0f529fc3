package console_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// A key with markup, an ampersand and a hash: the record link in the flash must carry
// it whole, and the page must show it as text.
const unknownKey = `charge-9 <i>x</i>&tenant=evil#top`

// historyEvents returns the events of the record page's history, oldest first.
func historyEvents(t *testing.T, ctx context.Context) string {
	t.Helper()
	ev := eval[[]string](t, ctx, `[...document.querySelectorAll("#history tr.event td:nth-child(2)")].map(c => c.textContent.trim())`)
	return strings.Join(ev, ",")
}

// cutLeader stops both followers of the leader l while it still leads: the console's
// next write is proposed on a leader that can reach no quorum, and Raft answers it
// when the leader's lease runs out (ErrLeadershipLost).
func cutLeader(t *testing.T, f *fixture, l int) {
	t.Helper()
	for i := range 3 {
		if i != l {
			f.c.Stop(i)
		}
	}
	if !f.c.Node(l).IsLeader() {
		t.Fatalf("node %d stepped down before the console's write was proposed: the scenario is wrong (stopping the followers took longer than the leader's lease)", l)
	}
}

// flashRecord checks that the page after an action shows the outcome-unknown
// explanation, as an error and not as a success, with a link to the record, and
// returns the link.
func flashRecord(t *testing.T, ctx context.Context, what string) string {
	t.Helper()
	flash := text(t, ctx, "#flash")
	mustContain(t, what, flash, idemkv.CodeOutcomeUnknown)
	mustContain(t, what, flash, "may or may not have been applied")
	mustContain(t, what, flash, "trying again is safe")
	for _, wrong := range []string{"Resolved “", "Approved “", "Denied “", "goroutine", ".go:"} {
		if strings.Contains(flash, wrong) {
			t.Fatalf("%s: the flash %q contains %q", what, flash, wrong)
		}
	}
	if cls := eval[string](t, ctx, `document.querySelector("#flash").className`); !strings.Contains(cls, "bad") {
		t.Fatalf("%s: the flash is of class %q, want an error (bad)", what, cls)
	}
	href := eval[string](t, ctx, `(document.querySelector("#flash a#flash-record") || {href: ""}).href`)
	if href == "" {
		t.Fatalf("%s: the flash %q has no link to the record", what, flash)
	}
	return href
}

// listUnread checks the list under the flash, which the page could not read while
// the cluster had no leader: it says so, shows no empty queue (the records are still
// there), and does not say that nothing changed (the operator's change may have).
func listUnread(t *testing.T, ctx context.Context, what string) {
	t.Helper()
	e := text(t, ctx, "#error")
	mustContain(t, what, e, idemkv.CodeUnavailable)
	mustContain(t, what, e, "could not be read")
	if strings.Contains(e, "Nothing was changed") {
		t.Fatalf("%s: the read's error %q says nothing was changed, under an action whose outcome is unknown", what, e)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll("#empty, #records, #approvals").length`); n != 0 {
		body := text(t, ctx, "main")
		t.Fatalf("%s: the page shows a list it could not read (%d elements): %q", what, n, body)
	}
}

// TestBrowserOutcomeUnknown: an operator's resolve and approval from the console, each
// proposed on a leader that then loses both followers, end indeterminate. The page
// says so, with a link to the record, and neither success nor a stack. After the
// cluster heals, the record page shows what really happened: the resolve committed
// (the cluster came back with one follower, so every quorum included the old leader,
// which votes for no log that lacks the entry), the approval did not (the followers
// elected one of them while the old leader was down, and its copy was dropped). Trying again is safe: the resolve is refused as settled
// and stays one resolve event; the approval is applied once.
func TestBrowserOutcomeUnknown(t *testing.T) {
	ctx := tab(t)
	f := startWith(t, 3, testAuth(t), testcluster.WithConfig(func(_ int, cfg *node.Config) {
		// A leader keeps leading this long after it lost its followers: long enough for
		// the test to stop them and the console to propose.
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 2*time.Second, 2*time.Second, 2*time.Second
	}))
	if l := f.c.LeaderIndex(t); l != 0 {
		t.Fatalf("leader is node %d, want the bootstrapped node 0", l)
	}
	f.inDoubt(t, unknownKey, "charge_card")
	f.awaiting(t, "refund-3", "Refund 30 EUR to order 3", map[string]any{"amount": "30.00"})

	login(t, ctx, f, 0, adminToken, "ops-admin")
	// A second tab of the same operator keeps the queue as it was before the outage,
	// with the same receipt typed in: the retry of a resolve that did land.
	stale := tab(t)
	login(t, stale, f, 0, adminToken, "ops-admin")
	for _, c := range []context.Context{ctx, stale} {
		do(t, c,
			chromedp.Navigate(f.url(0, "/ui/in-doubt?tenant=acme")),
			chromedp.WaitVisible(chromedp.CSS("tr.record")),
			chromedp.SendKeys(chromedp.CSS("form.resolve-committed input[name=remote_system]"), "stripe"),
			chromedp.SendKeys(chromedp.CSS("form.resolve-committed input[name=remote_id]"), "ch_3Q9"),
		)
	}
	shot(t, ctx, "unknown-1-queue")

	// 1. A resolve proposed on a leader that is cut off.
	begin := time.Now()
	cutLeader(t, f, 0)
	submit(t, ctx, "form.resolve-committed button")
	t.Logf("the resolve was answered after %v", time.Since(begin).Round(time.Millisecond))
	link := flashRecord(t, ctx, "resolve on a cut-off leader")
	noMarkup(t, ctx, "the outcome-unknown flash", unknownKey)
	listUnread(t, ctx, "the in-doubt queue during the outage")
	shot(t, ctx, "unknown-2-resolve-outcome-unknown")
	u, err := url.Parse(link)
	if err != nil || u.Path != "/ui/record" || u.Query().Get("tenant") != tenant || u.Query().Get("key") != unknownKey {
		t.Fatalf("the flash links to %q, want the record page of %q: %v", link, unknownKey, err)
	}

	// Heal with one follower: the only quorum is node 0 and node 1, and node 0 votes for
	// no log shorter than its own, which holds the entry. So whoever wins holds it (node
	// 1 may have it too: Raft's replication to it may deliver it after node 0 stepped
	// down, once node 1 is back), and the entry commits.
	f.c.Restart(1)
	f.c.WaitLeader()
	do(t, ctx, chromedp.Click(chromedp.CSS("#flash-record")), chromedp.WaitVisible(chromedp.CSS("#record")))
	if got := text(t, ctx, "#key"); got != unknownKey {
		t.Fatalf("the record link opened %q, want %q", got, unknownKey)
	}
	mustContain(t, "the record after the heal", text(t, ctx, "#status"), string(idemkv.StatusCommitted))
	mustContain(t, "the receipt after the heal", text(t, ctx, "#receipt"), "stripe ch_3Q9")
	if got := historyEvents(t, ctx); got != "execute,doubt,resolve" {
		t.Fatalf("history after the heal: %q, want execute,doubt,resolve", got)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll("form.resolve-committed").length`); n != 0 {
		t.Fatalf("the settled record's page offers %d resolve forms", n)
	}
	noMarkup(t, ctx, "the record page", unknownKey)
	shot(t, ctx, "unknown-3-resolve-settled")

	// Trying again, from the tab that still shows the old queue: refused as settled,
	// and still one resolve.
	submit(t, stale, "form.resolve-committed button")
	flash := text(t, stale, "#flash")
	mustContain(t, "the retried resolve", flash, idemkv.CodeNotPending)
	mustContain(t, "the retried resolve says the record is settled", flash, "committed")
	shot(t, stale, "unknown-4-resolve-retried")
	do(t, ctx, chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#history")))
	if got := historyEvents(t, ctx); got != "execute,doubt,resolve" {
		t.Fatalf("history after the retry: %q, want one resolve", got)
	}
	rec, err := f.get(t, unknownKey)
	if err != nil || rec.Status != idemkv.StatusCommitted || rec.Receipt == nil || rec.Receipt.RemoteID != "ch_3Q9" {
		t.Fatalf("the record after the retry: %v %+v", err, rec)
	}
	f.c.Restart(2)
	f.c.WaitConverged()

	// 2. An approval proposed on a leader that is cut off: the operator works on the
	// console of whichever node leads now.
	l := f.c.WaitLeader()
	if l != 0 {
		login(t, ctx, f, l, adminToken, "ops-admin")
	}
	do(t, ctx,
		chromedp.Navigate(f.url(l, "/ui/approvals?tenant=acme")),
		chromedp.WaitVisible(chromedp.CSS("article.approval")),
		chromedp.SendKeys(chromedp.CSS("article.approval input[name=reason]"), "checked with finance"),
	)
	begin = time.Now()
	cutLeader(t, f, l)
	submit(t, ctx, "article.approval button.approve")
	t.Logf("the approval was answered after %v", time.Since(begin).Round(time.Millisecond))
	link = flashRecord(t, ctx, "approval on a cut-off leader")
	listUnread(t, ctx, "the approvals during the outage")
	shot(t, ctx, "unknown-5-approve-outcome-unknown")
	if u, err := url.Parse(link); err != nil || u.Query().Get("key") != "refund-3" {
		t.Fatalf("the flash links to %q, want the record of refund-3: %v", link, err)
	}

	// Heal without the old leader: the followers, stopped before the entry was
	// proposed, elect one of them, and the old leader drops its copy when it comes back.
	f.c.Stop(l)
	for i := range 3 {
		if i != l {
			f.c.Restart(i)
		}
	}
	if nl := f.c.WaitLeader(); nl == l {
		t.Fatalf("node %d leads while stopped", l)
	}
	f.c.Restart(l)
	f.c.WaitConverged()

	// The old leader restarted, so its console asks for a login first, then shows the
	// record.
	do(t, ctx, chromedp.Click(chromedp.CSS("#flash-record")), chromedp.WaitVisible(chromedp.CSS("#token")))
	do(t, ctx,
		chromedp.SendKeys(chromedp.CSS("#token"), adminToken),
		chromedp.Click(chromedp.CSS("#login")),
		chromedp.WaitVisible(chromedp.CSS("#record")),
	)
	if got := text(t, ctx, "#key"); got != "refund-3" {
		t.Fatalf("after the login the record page shows %q, want refund-3", got)
	}
	mustContain(t, "the approval after the heal", text(t, ctx, "#approval"), string(idemkv.ApprovalWaiting))
	if got := historyEvents(t, ctx); got != "approval_requested" {
		t.Fatalf("history after the heal: %q, want approval_requested alone", got)
	}
	shot(t, ctx, "unknown-6-approval-still-waiting")

	// Trying again from the record page: approved once.
	do(t, ctx, chromedp.SendKeys(chromedp.CSS("form.decide input[name=reason]"), "checked with finance"))
	submit(t, ctx, "form.decide button.approve")
	mustContain(t, "the retried approval", text(t, ctx, "#flash"), "Approved “refund-3” of tenant acme as ops-admin")
	do(t, ctx, chromedp.Navigate(f.url(l, "/ui/record?tenant=acme&key=refund-3")), chromedp.WaitVisible(chromedp.CSS("#history")))
	if got := historyEvents(t, ctx); got != "approval_requested,approval_decided" {
		t.Fatalf("history after the retry: %q, want one decision", got)
	}
	mustContain(t, "the approval after the retry", text(t, ctx, "#approval"), "by ops-admin")
	shot(t, ctx, "unknown-7-approval-retried")
	rec, err = f.get(t, "refund-3")
	if err != nil || rec.Approval == nil || rec.Approval.State != idemkv.ApprovalApproved || rec.Approval.Reason != "checked with finance" {
		t.Fatalf("refund-3 after the retry: %v %+v", err, rec)
	}
}
