package console_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/auth"
	"github.com/idemkv/idemkv/console"
)

// browserLike is an HTTP client with a cookie jar that does not follow redirects.
func browserLike(t *testing.T) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func post(t *testing.T, c *http.Client, u string, form url.Values, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func getPage(t *testing.T, c *http.Client, u string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// TestCSRFAndHeaders: every page carries the strict CSP and its companions; the
// session cookie is HttpOnly and SameSite=Strict and holds no token; a resolve without
// the CSRF token, or from another origin, is refused and changes nothing, and the same
// form with both is applied.
func TestCSRFAndHeaders(t *testing.T) {
	f := start(t, 1, false)
	rec := f.inDoubt(t, "order-1", "refund")
	base := f.url(0, "")
	c := browserLike(t)

	resp, _ := getPage(t, c, base+"/ui/in-doubt")
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/ui/login") {
		t.Fatalf("unauthenticated page: %d %q, want a redirect to the login page", resp.StatusCode, resp.Header.Get("Location"))
	}
	if resp := post(t, c, base+"/ui/login", url.Values{"token": {"not-a-token"}}, nil); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("login with a bad token: %d, want 401", resp.StatusCode)
	}
	if resp := post(t, c, base+"/ui/login", url.Values{"token": {adminToken}}, map[string]string{"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-site login: %d, want 403", resp.StatusCode)
	}
	resp = post(t, c, base+"/ui/login", url.Values{"token": {adminToken}, "next": {"/ui/in-doubt"}}, nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/in-doubt" {
		t.Fatalf("login: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	cookies := resp.Cookies()
	if len(cookies) != 1 {
		t.Fatalf("login set %d cookies", len(cookies))
	}
	ck := cookies[0]
	if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/ui/" || ck.Secure || ck.MaxAge <= 0 {
		t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, Path=/ui/, a max age, Secure only over TLS", ck)
	}
	if !strings.HasPrefix(ck.Name, "idemkv_console_127_0_0_1_") {
		t.Errorf("cookie name %q: want it to name the host and port", ck.Name)
	}
	if strings.Contains(ck.Value, adminToken) {
		t.Fatal("the cookie holds the token")
	}

	for _, p := range []string{"/ui/", "/ui/in-doubt", "/ui/approvals", "/ui/conflicts", "/ui/records", "/ui/login", "/ui/static/console.css", "/ui/nope"} {
		resp, body := getPage(t, c, base+p)
		h := resp.Header
		if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") || strings.Contains(csp, "unsafe-inline") {
			t.Errorf("%s: Content-Security-Policy %q", p, csp)
		}
		if h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Referrer-Policy") != "no-referrer" {
			t.Errorf("%s: X-Content-Type-Options %q, Referrer-Policy %q", p, h.Get("X-Content-Type-Options"), h.Get("Referrer-Policy"))
		}
		if strings.Contains(body, adminToken) {
			t.Errorf("%s: the page holds the token", p)
		}
		if strings.HasSuffix(p, ".css") {
			continue
		}
		if strings.Contains(body, "<script>") || strings.Contains(body, " on") && regexp.MustCompile(`\son[a-z]+=`).MatchString(body) {
			t.Errorf("%s: inline script or event handler in the page", p)
		}
	}
	resp, body := getPage(t, c, base+"/ui/in-doubt")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("in-doubt page: %d", resp.StatusCode)
	}
	m := csrfField.FindStringSubmatch(body)
	if m == nil {
		t.Fatal("no CSRF token in the page's forms")
	}
	form := url.Values{"tenant": {tenant}, "key": {"order-1"}, "fingerprint": {rec.Fingerprint}, "outcome": {"not_executed"}, "confirm": {"yes"}}
	u := base + "/ui/in-doubt/resolve"
	if resp := post(t, c, u, form, nil); resp.StatusCode != http.StatusForbidden {
		t.Errorf("resolve without the CSRF token: %d, want 403", resp.StatusCode)
	}
	withToken := url.Values{"csrf": {m[1]}}
	for k, v := range form {
		withToken[k] = v
	}
	wrong := url.Values{"csrf": {m[1] + "x"}}
	for k, v := range form {
		wrong[k] = v
	}
	if resp := post(t, c, u, wrong, nil); resp.StatusCode != http.StatusForbidden {
		t.Errorf("resolve with a wrong CSRF token: %d, want 403", resp.StatusCode)
	}
	if resp := post(t, c, u, withToken, map[string]string{"Origin": "http://evil.example"}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("resolve from another origin: %d, want 403", resp.StatusCode)
	}
	if resp := post(t, c, u, withToken, map[string]string{"Sec-Fetch-Site": "cross-site"}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("resolve from another site: %d, want 403", resp.StatusCode)
	}
	if r, err := f.get(t, "order-1"); err != nil || !r.InDoubt {
		t.Fatalf("after refused forms the record must be untouched: %v %+v", err, r)
	}
	if resp := post(t, c, u, withToken, map[string]string{"Origin": base, "Sec-Fetch-Site": "same-origin"}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("resolve with the token from the console's origin: %d, want 303", resp.StatusCode)
	}
	if _, err := f.get(t, "order-1"); err == nil {
		t.Fatal("the accepted resolve did not release the record")
	}

	// Logging out ends the session on the server: the old cookie opens nothing.
	if resp := post(t, c, base+"/ui/logout", url.Values{"csrf": {m[1]}}, nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: %d", resp.StatusCode)
	}
	replay := browserLike(t)
	replay.Jar.SetCookies(mustURL(t, base+"/ui/"), []*http.Cookie{{Name: ck.Name, Value: ck.Value}})
	if resp, _ := getPage(t, replay, base+"/ui/in-doubt"); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("a logged-out session's cookie: %d, want a redirect to the login page", resp.StatusCode)
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestAuthOffSaysSo: without authentication every page says so, and forms still need
// the CSRF token of the browser's session.
func TestAuthOffSaysSo(t *testing.T) {
	f := start(t, 1, true)
	rec := f.inDoubt(t, "order-2", "refund")
	c := browserLike(t)
	var csrf string
	for _, p := range []string{"/ui/", "/ui/in-doubt", "/ui/approvals?tenant=acme", "/ui/conflicts", "/ui/records?tenant=acme", "/ui/record?tenant=acme&key=order-2", "/ui/login"} {
		resp, body := getPage(t, c, f.url(0, p))
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="auth-off"`) {
			t.Errorf("%s: %d, says authentication is off: %v", p, resp.StatusCode, strings.Contains(body, `id="auth-off"`))
		}
		if m := csrfField.FindStringSubmatch(body); m != nil {
			csrf = m[1]
		}
	}
	if csrf == "" {
		t.Fatal("no CSRF token on any page")
	}
	u := f.url(0, "/ui/in-doubt/resolve")
	form := url.Values{"tenant": {tenant}, "key": {"order-2"}, "fingerprint": {rec.Fingerprint}, "outcome": {"committed"}, "remote_system": {"s"}, "remote_id": {"r-1"}}
	if resp := post(t, c, u, form, nil); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("resolve without the CSRF token, authentication off: %d, want 403", resp.StatusCode)
	}
	form.Set("csrf", csrf)
	if resp := post(t, c, u, form, nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("resolve with it: %d", resp.StatusCode)
	}
	if r, err := f.get(t, "order-2"); err != nil || r.Status != idemkv.StatusCommitted {
		t.Fatalf("order-2: %v %+v", err, r)
	}
}

// TestConflictsRing: the ring keeps the newest, pages newest first, and says how many
// it dropped.
func TestConflictsRing(t *testing.T) {
	ring := console.NewConflicts(3)
	for i := range 5 {
		ring.Observe(context.Background(), &idemkv.ReserveRequest{Tenant: tenant, Key: string(rune('a' + i))},
			&idemkv.ReserveResult{Decision: idemkv.DecisionConflict, Conflict: &idemkv.Conflict{Status: "conflict"}})
	}
	ring.Observe(context.Background(), &idemkv.ReserveRequest{Tenant: tenant, Key: "x"}, &idemkv.ReserveResult{Decision: idemkv.DecisionExecute})
	all := func(*console.ConflictEntry) bool { return true }
	page, next, kept, dropped := ring.Page(0, 2, all)
	if len(page) != 2 || page[0].Key != "e" || page[1].Key != "d" || next != page[1].Seq || kept != 3 || dropped != 2 {
		t.Fatalf("first page %+v next %d kept %d dropped %d", page, next, kept, dropped)
	}
	page, next, _, _ = ring.Page(next, 2, all)
	if len(page) != 1 || page[0].Key != "c" || next != 0 {
		t.Fatalf("second page %+v next %d", page, next)
	}
	page, _, _, _ = ring.Page(0, 10, func(e *console.ConflictEntry) bool { return e.Key == "d" })
	if len(page) != 1 || page[0].Key != "d" {
		t.Fatalf("filtered page %+v", page)
	}
}

// One tenant's flood of conflicting reserves pushes out its own oldest conflicts, not
// every other tenant's.
func TestConflictsShareByTenant(t *testing.T) {
	ring := console.NewConflicts(4)
	conflict := &idemkv.ReserveResult{Decision: idemkv.DecisionConflict, Conflict: &idemkv.Conflict{Status: "conflict"}}
	ring.Observe(context.Background(), &idemkv.ReserveRequest{Tenant: "quiet", Key: "q1"}, conflict)
	ring.Observe(context.Background(), &idemkv.ReserveRequest{Tenant: "calm", Key: "c1"}, conflict)
	for i := range 100 {
		ring.Observe(context.Background(), &idemkv.ReserveRequest{Tenant: "noisy", Key: fmt.Sprint("n", i)}, conflict)
	}
	page, _, kept, dropped := ring.Page(0, 10, func(*console.ConflictEntry) bool { return true })
	var keys []string
	for _, e := range page {
		keys = append(keys, e.Key)
	}
	if got := strings.Join(keys, ","); got != "n99,n98,c1,q1" || kept != 4 || dropped != 98 {
		t.Fatalf("kept %s (%d, dropped %d), want n99,n98,c1,q1 (4, dropped 98)", got, kept, dropped)
	}
}

// TestRevokedTokenEndsSession: removing a token from the token file (and reloading it,
// as SIGHUP does) ends the sessions opened with it at once.
func TestRevokedTokenEndsSession(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.yaml")
	write := func(withApprover bool) {
		doc := "tokens:\n  - {name: ops-admin, hash: \"" + auth.HashToken(adminToken) + "\", role: admin}\n"
		if withApprover {
			doc += "  - {name: alice-approver, hash: \"" + auth.HashToken(approverToken) + "\", role: approver, tenants: [acme]}\n"
		}
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(true)
	a, err := auth.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := startWith(t, 1, a)
	c := browserLike(t)
	if resp := post(t, c, f.url(0, "/ui/login"), url.Values{"token": {approverToken}}, nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: %d", resp.StatusCode)
	}
	if resp, body := getPage(t, c, f.url(0, "/ui/approvals")); resp.StatusCode != http.StatusOK || !strings.Contains(body, "alice-approver") {
		t.Fatalf("approvals page before the revocation: %d", resp.StatusCode)
	}
	write(false)
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	resp, _ := getPage(t, c, f.url(0, "/ui/approvals"))
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/ui/login") {
		t.Fatalf("after the token left the file: %d %q, want a redirect to the login page", resp.StatusCode, resp.Header.Get("Location"))
	}
}

// TestQueuesPage: the in-doubt and approvals queues show 50 a page, oldest first, and
// the next page goes on where the first stopped.
func TestQueuesPage(t *testing.T) {
	f := start(t, 1, false)
	for i := range 52 {
		f.inDoubt(t, fmt.Sprintf("doubt-%03d", i), "wire")
		f.awaiting(t, fmt.Sprintf("approve-%03d", i), "refund", map[string]any{"n": i})
	}
	c := browserLike(t)
	if resp := post(t, c, f.url(0, "/ui/login"), url.Values{"token": {adminToken}}, nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: %d", resp.StatusCode)
	}
	next := regexp.MustCompile(`id="next" href="([^"]+)"`)
	for _, q := range []struct{ page, item, first2 string }{
		{"/ui/in-doubt", `<tr class="record">`, "doubt-050"},
		{"/ui/approvals?tenant=acme", `<article class="approval">`, "approve-050"},
	} {
		_, body := getPage(t, c, f.url(0, q.page))
		if n := strings.Count(body, q.item); n != 50 {
			t.Fatalf("%s: %d items on the first page, want 50", q.page, n)
		}
		m := next.FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("%s: no next page link", q.page)
		}
		base := strings.SplitN(q.page, "?", 2)[0]
		_, body = getPage(t, c, f.url(0, base+strings.ReplaceAll(m[1], "&amp;", "&")))
		if n := strings.Count(body, q.item); n != 2 || !strings.Contains(body, q.first2) || next.MatchString(body) {
			t.Fatalf("%s: second page has %d items (want 2, from %s, no next link)", q.page, n, q.first2)
		}
	}
}

// A viewer of one tenant learns nothing of the others' conflicts: the count kept is of
// its tenants, and the numbers it pages by are times, not a count of every tenant's
// entries (the gaps between its own entries' numbers told how many the others got).
func TestConflictsTellNothingOfOtherTenants(t *testing.T) {
	ring := console.NewConflicts(10)
	conflict := &idemkv.ReserveResult{Decision: idemkv.DecisionConflict, Conflict: &idemkv.Conflict{Status: "conflict"}}
	observe := func(tenant, key string) {
		ring.Observe(context.Background(), &idemkv.ReserveRequest{Tenant: tenant, Key: key}, conflict)
	}
	observe("mine", "m1")
	for i := range 5 {
		observe("theirs", fmt.Sprint("t", i))
	}
	observe("mine", "m2")
	page, next, kept, _ := ring.Page(0, 1, func(e *console.ConflictEntry) bool { return e.Tenant == "mine" })
	if len(page) != 1 || page[0].Key != "m2" || kept != 2 {
		t.Fatalf("page %+v, kept %d: want m2, 2 kept of the viewer's tenant", page, kept)
	}
	older, _, kept, _ := ring.Page(next, 1, func(e *console.ConflictEntry) bool { return e.Tenant == "mine" })
	if len(older) != 1 || older[0].Key != "m1" || kept != 2 {
		t.Fatalf("older page %+v, kept %d", older, kept)
	}
	for _, e := range append(page, older...) {
		if e.Seq < uint64(e.At.UnixNano()) {
			t.Errorf("entry %s numbered %d, before its time %d: a count of every tenant's entries", e.Key, e.Seq, e.At.UnixNano())
		}
	}
	if page[0].Seq <= older[0].Seq {
		t.Errorf("m2 numbered %d, not after m1's %d", page[0].Seq, older[0].Seq)
	}
}
