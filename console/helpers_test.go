package console_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
	"github.com/idemkv/idemkv/auth"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/console"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// One browser for the whole test binary; each test gets browser contexts of its own
// (separate cookies), as separate people would.
var (
	browser    context.Context
	browserErr error
)

// chromiumPath is Debian's chromium, or one on PATH.
func chromiumPath() string {
	for _, p := range []string{"/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	return ""
}

func TestMain(m *testing.M) {
	var stop func()
	if path := chromiumPath(); path != "" {
		opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
			chromedp.Flag("disable-gpu", true), chromedp.WindowSize(1400, 1000))
		alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
		b, cancelBrowser := chromedp.NewContext(alloc)
		// The first run starts the browser; it must have no deadline of its own.
		if browserErr = chromedp.Do(b); browserErr == nil {
			browser = b
		}
		stop = func() { cancelBrowser(); cancelAlloc() }
	}
	code := m.Run()
	if stop != nil {
		stop()
	}
	os.Exit(code)
}

// tab returns a page in a browser context of its own, or skips the test when there
// is no Chromium on this machine (CI installs it: .ci/run).
func tab(t *testing.T) context.Context {
	t.Helper()
	if browserErr != nil {
		t.Fatalf("chromium is installed but did not start: %v", browserErr)
	}
	if browser == nil {
		t.Skip("no Chromium at /usr/bin/chromium or on PATH: install Debian's chromium package to run the browser tests")
	}
	ctx, cancel := chromedp.NewContext(browser, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("new tab: %v", err)
	}
	return ctx
}

// do runs browser steps under a deadline.
func do(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(sctx, steps...); err != nil {
		t.Fatalf("browser: %v", err)
	}
}

// text returns the text of the first element sel matches.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := chromedp.Run(sctx, chromedp.TextContent(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

// eval runs a JavaScript expression in the page.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(sctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// shot saves a full-page screenshot of what the tab shows under the test's
// artifact directory (go test -artifacts keeps it under -outputdir).
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(t.ArtifactDir(), name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s (%d bytes)", path, len(png))
}

// Tokens of the test token file, by role.
const (
	adminToken    = "tok-admin-0123456789"
	approverToken = "tok-approver-0123456789"
	monitorToken  = "tok-monitor-0123456789"
	clientToken   = "tok-client-0123456789"
	tenant        = "acme"
)

func testAuth(t *testing.T) *auth.Authenticator {
	t.Helper()
	a, err := auth.New(&auth.File{Tokens: []auth.Token{
		{Name: "ops-admin", Hash: auth.HashToken(adminToken), Role: auth.RoleAdmin},
		{Name: "alice-approver", Hash: auth.HashToken(approverToken), Role: auth.RoleApprover, Tenants: []string{tenant}},
		{Name: "grafana", Hash: auth.HashToken(monitorToken), Role: auth.RoleMonitor},
		{Name: "agent", Hash: auth.HashToken(clientToken), Role: auth.RoleClient, Tenants: []string{tenant}},
	}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// fixture is a real cluster whose nodes serve the console over the API, as `idemkv
// serve` does, with authentication on unless authOff.
type fixture struct {
	c     *testcluster.Cluster
	admin *client.Client
}

func start(t *testing.T, nodes int, authOff bool) *fixture {
	t.Helper()
	var a *auth.Authenticator
	if !authOff {
		a = testAuth(t)
	}
	return startWith(t, nodes, a)
}

// startWith starts nodes with a as their authentication (nil: off), and the cluster's
// other options (a node's configuration, for one).
func startWith(t *testing.T, nodes int, a *auth.Authenticator, more ...testcluster.Option) *fixture {
	t.Helper()
	opts := append([]testcluster.Option(nil), more...)
	if a != nil {
		opts = append(opts, testcluster.WithAPIMiddleware(a.Middleware))
	}
	opts = append(opts, testcluster.WithServe(func(_ int, cfg api.Config) http.Handler {
		// As idemkv serve does: the in-doubt and approval gauges are the node's.
		if err := cfg.Store.(*node.Node).RegisterMetrics(cfg.Metrics); err != nil {
			t.Error(err)
		}
		ring := console.NewConflicts(0)
		cfg.OnReserve = ring.Observe
		h := api.New(cfg).Handler()
		cc := console.Config{API: h, Conflicts: ring, Logger: cfg.Logger}
		if a != nil {
			cc.Auth = a
		}
		return console.New(cc).Mount(h)
	}))
	c := testcluster.Start(t, nodes, opts...)
	admin, err := client.New(client.Config{Endpoints: c.Endpoints(), Token: adminToken})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	return &fixture{c: c, admin: admin}
}

func (f *fixture) url(i int, path string) string { return "http://" + f.c.Endpoint(i) + path }

func effect(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// inDoubt makes a record in doubt: reserved, then marked by the attempt that found
// its predecessor dead.
func (f *fixture) inDoubt(t *testing.T, key, tool string) *idemkv.Record {
	t.Helper()
	ctx := context.Background()
	res, err := f.admin.Reserve(ctx, &idemkv.ReserveRequest{Tenant: tenant, Key: key, Tool: tool, Actor: "agent-7",
		Effect: effect(map[string]any{"amount": 40, "order": key})})
	if err != nil || res.Decision != idemkv.DecisionExecute {
		t.Fatalf("reserve %q: %v %+v", key, err, res)
	}
	rec, err := f.admin.Doubt(ctx, &idemkv.DoubtRequest{Tenant: tenant, Key: key, Fingerprint: res.Record.Fingerprint, Fence: res.Fence})
	if err != nil || !rec.InDoubt {
		t.Fatalf("doubt %q: %v %+v", key, err, rec)
	}
	return rec
}

// awaiting makes a record that waits for an approval.
func (f *fixture) awaiting(t *testing.T, key, summary string, eff any) *idemkv.Record {
	t.Helper()
	res, err := f.admin.Reserve(context.Background(), &idemkv.ReserveRequest{Tenant: tenant, Key: key, Tool: "refund", Actor: "agent-7",
		Effect: effect(eff), Approval: &idemkv.ApprovalAsk{Required: true, Summary: summary}})
	if err != nil || res.Decision != idemkv.DecisionNeedsApproval {
		t.Fatalf("reserve %q: %v %+v", key, err, res)
	}
	return res.Record
}

func (f *fixture) get(t *testing.T, key string) (*idemkv.Record, error) {
	t.Helper()
	return f.admin.Get(context.Background(), &idemkv.GetRequest{Tenant: tenant, Key: key})
}

// login logs the tab in on node i with token and checks who the console says it is.
func login(t *testing.T, ctx context.Context, f *fixture, i int, token, wantName string) {
	t.Helper()
	do(t, ctx,
		chromedp.Navigate(f.url(i, "/ui/")),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS("#login")),
		chromedp.WaitVisible(chromedp.CSS("#who")),
	)
	if got := text(t, ctx, "#who"); got != wantName {
		t.Fatalf("logged in as %q, want %q", got, wantName)
	}
}

// submit clicks sel, which sends a form, and waits for the page the console
// redirects to (the old page's flash must not pass for the new one's).
func submit(t *testing.T, ctx context.Context, sel string) {
	t.Helper()
	do(t, ctx,
		func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
			_, err := chromedp.Evaluate[bool](`document.body.dataset.stale = "1"; true`)(ctx, tg)
			return chromedp.Void{}, err
		},
		chromedp.Click(chromedp.CSS(sel)),
		chromedp.WaitVisible(chromedp.CSS("body:not([data-stale]) main")),
	)
}

func mustContain(t *testing.T, what, got, want string) {
	t.Helper()
	if !strings.Contains(got, want) {
		t.Fatalf("%s: %q does not contain %q", what, got, want)
	}
}
