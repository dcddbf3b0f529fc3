package console

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
)

// TestSessionsBounded: a session ends when idle too long, when too old however used,
// and the least recently used one gives way when the table is full.
func TestSessionsBounded(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	ss := newSessions(2, 2, time.Minute, time.Hour)
	a := ss.start("ta", "ta", t0)
	b := ss.start("tb", "tb", t0.Add(time.Second))
	if _, ok := ss.get(a.id, t0.Add(2*time.Second), true); !ok {
		t.Fatal("a fresh session is gone")
	}
	// b is now the least recently used: a third login ends it.
	c := ss.start("tc", "tc", t0.Add(3*time.Second))
	if _, ok := ss.get(b.id, t0.Add(4*time.Second), true); ok {
		t.Fatal("the least recently used session survived a login beyond the bound")
	}
	if ss.len() != 2 {
		t.Fatalf("%d sessions, want 2", ss.len())
	}
	if _, ok := ss.get(c.id, t0.Add(3*time.Second+2*time.Minute), true); ok {
		t.Fatal("a session idle past the idle limit is still open")
	}
	// Used every 30 s, a session still ends at its lifetime.
	d := ss.start("td", "td", t0)
	at := t0
	for at.Sub(t0) < time.Hour-30*time.Second {
		at = at.Add(30 * time.Second)
		if _, ok := ss.get(d.id, at, true); !ok {
			t.Fatalf("session ended early at %v", at.Sub(t0))
		}
	}
	if _, ok := ss.get(d.id, at.Add(time.Minute), true); ok {
		t.Fatal("a session outlived its lifetime")
	}
	if a.csrf == b.csrf || a.id == a.csrf || len(a.id) < 40 {
		t.Fatalf("session ids and CSRF tokens must be distinct random values: %q %q", a.id, a.csrf)
	}
}

// One caller logging in over and over (a token, or a script without a cookie while
// authentication is off) ends its own sessions, never another's; when the table is
// full, the caller holding the most gives way.
func TestSessionsShareByCaller(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	ss := newSessions(6, 3, time.Hour, time.Hour)
	operator := ss.start("op", "operator", t0)
	second := ss.start("op2", "other", t0.Add(time.Second))
	at := t0.Add(2 * time.Second)
	for range 100 {
		at = at.Add(time.Millisecond)
		ss.start("x", "flooder", at)
	}
	for _, s := range []*session{operator, second} {
		if _, ok := ss.get(s.id, at, true); !ok {
			t.Fatalf("%s's session was ended by another caller's logins", s.owner)
		}
	}
	if ss.len() != 5 {
		t.Fatalf("%d sessions, want 5 (the flooder's share of 3 and two others)", ss.len())
	}
	// Full: the next caller's login ends a session of the one holding the most.
	ss.start("y", "fourth", at.Add(time.Second))
	ss.start("z", "fifth", at.Add(2*time.Second))
	for _, s := range []*session{operator, second} {
		if _, ok := ss.get(s.id, at.Add(3*time.Second), true); !ok {
			t.Fatalf("%s's session was ended to make room, while the flooder held more", s.owner)
		}
	}
	held := 0
	for _, s := range ss.byID {
		if s.owner == "flooder" {
			held++
		}
	}
	if held != 2 || ss.len() != 6 {
		t.Fatalf("flooder holds %d of %d sessions, want 2 of 6", held, ss.len())
	}
}

// TestDescribeOutcomeUnknown: an indeterminate outcome says so, and what to do.
func TestDescribeOutcomeUnknown(t *testing.T) {
	err := errors.Join(errors.New("client: POST /v1/resolve"), &idemkv.Error{Code: idemkv.CodeOutcomeUnknown, Message: "leadership lost while replicating"})
	u := describe(err)
	if u.Code != idemkv.CodeOutcomeUnknown || u.Message != "leadership lost while replicating" {
		t.Fatalf("%+v", u)
	}
	for _, want := range []string{"may or may not have been applied", "Open the record"} {
		if !strings.Contains(u.String(), want) {
			t.Fatalf("%q lacks %q", u.String(), want)
		}
	}
}

// TestRates: a rate is the growth since the oldest sample of the last minute, and
// appears once a sample at least rateMinSpan old exists.
func TestRates(t *testing.T) {
	var rt rates
	t0 := time.Unix(1_800_000_000, 0)
	counts := func(execute, conflict float64) map[string]map[string]float64 {
		return map[string]map[string]float64{"refund": {"execute": execute, "conflict": conflict}, "quiet": {"replay": 3}}
	}
	got, span := rt.observe(t0, counts(10, 1))
	if span != 0 || got[0].PerSecond != 0 {
		t.Fatalf("first sample: span %v, %+v", span, got)
	}
	got, span = rt.observe(t0.Add(10*time.Second), counts(60, 6))
	if span != 10*time.Second || got[0].Tool != "refund" || got[0].PerSecond != 5.5 || got[0].ConflictsPerSec != 0.5 || got[0].Total != 66 {
		t.Fatalf("after 10 s: span %v, %+v", span, got)
	}
	if got[1].Tool != "quiet" || got[1].PerSecond != 0 || got[1].Total != 3 {
		t.Fatalf("quiet tool: %+v", got[1])
	}
	// Two minutes on, the old samples are gone and the rate restarts from the newest.
	got, span = rt.observe(t0.Add(130*time.Second), counts(60, 6))
	if span != 0 || got[0].PerSecond != 0 {
		t.Fatalf("after the window: span %v, %+v", span, got)
	}
}

// TestListNotShownWhenUnread: a list page whose read failed shows the error and no
// list, not an empty one ("Nothing in doubt" would say the records are gone), and a
// read's unavailable does not say "nothing was changed" (an action's does).
func TestListNotShownWhenUnread(t *testing.T) {
	s := New(Config{API: http.NotFoundHandler()})
	err := idemkv.Errorf(idemkv.ErrUnavailable, "no leader is known; retry")
	for _, page := range []string{"in-doubt", "approvals", "records"} {
		d := &pageData{Title: page, Nav: page, page: page, Err: describeRead(err), Body: listBody{Tenant: "acme", Asked: true}}
		w := httptest.NewRecorder()
		s.render(w, http.StatusOK, d)
		body := w.Body.String()
		for _, list := range []string{`id="records"`, `id="approvals"`, `id="empty"`} {
			if strings.Contains(body, list) {
				t.Errorf("%s: a failed read still shows a list (%s)", page, list)
			}
		}
		if !strings.Contains(body, "could not be read") || strings.Contains(body, "Nothing was changed") {
			t.Errorf("%s: the read's error is not said to be a read's:\n%s", page, body)
		}
		d.Err = nil
		w = httptest.NewRecorder()
		s.render(w, http.StatusOK, d)
		if !strings.Contains(w.Body.String(), `id="empty"`) {
			t.Errorf("%s: a read that found nothing shows no empty list", page)
		}
	}
	if h := describe(err).Hint; !strings.Contains(h, "Nothing was changed") {
		t.Errorf("an action's unavailable: hint %q", h)
	}
}

// A page's own reload is not its user's activity: an unattended overview, which reloads
// every 15 s, lets its session end when idle, not at its lifetime.
func TestAutoRefreshDoesNotKeepASessionAlive(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	ss := newSessions(10, 10, time.Minute, time.Hour)
	s := ss.start("t", "t", t0)
	at := t0
	for range 3 {
		at = at.Add(15 * time.Second)
		if _, ok := ss.get(s.id, at, false); !ok {
			t.Fatal("the session ended within its idle limit")
		}
	}
	if _, ok := ss.get(s.id, t0.Add(61*time.Second), false); ok {
		t.Fatal("reloads alone kept the session past its idle limit")
	}
	if !strings.Contains(pagesLayoutForTest(t), "url=?"+autoRefresh+"=1") {
		t.Fatal("the page does not reload with the auto-refresh mark")
	}
}

func pagesLayoutForTest(t *testing.T) string {
	t.Helper()
	b, err := templateFiles.ReadFile("templates/layout.html")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
