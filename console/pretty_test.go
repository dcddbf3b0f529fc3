package console

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
)

// Deep or large stored JSON is shown as stored: indenting it multiplies its size by
// its depth.
func TestPrettyJSONIsBounded(t *testing.T) {
	if got := prettyJSON([]byte(`{"a":[1,{"b":"[[[["}]}`)); got != "{\n  \"a\": [\n    1,\n    {\n      \"b\": \"[[[[\"\n    }\n  ]\n}" {
		t.Errorf("a small effect: %q", got)
	}
	deep := strings.Repeat("[", 999) + strings.Repeat("0,", 30000) + "0" + strings.Repeat("]", 999)
	if got := prettyJSON([]byte(deep)); len(got) != len(deep) {
		t.Errorf("JSON nested 999 deep became %d bytes from %d", len(got), len(deep))
	}
	wide := "[" + strings.Repeat(`"x",`, 8000) + `"x"]`
	if got := prettyJSON([]byte(wide)); got != wide {
		t.Errorf("%d bytes of JSON were indented", len(wide))
	}
}

// A redirect after a form stays on console pages: a dot segment would leave them.
func TestLocalPathStaysInTheConsole(t *testing.T) {
	for next, want := range map[string]string{
		"/ui/record?tenant=a&key=../x": "/ui/record?tenant=a&key=../x",
		"/ui/":                         "/ui/",
		"/ui/approvals":                "/ui/approvals",
		"/ui/../metrics":               "/ui/",
		"/ui/a/../../v1/backup":        "/ui/",
		"/ui/%2e%2e/metrics":           "/ui/",
		"/ui/%2E%2E/metrics":           "/ui/",
		"/ui/./approvals":              "/ui/",
		"/ui/.\t./metrics":             "/ui/",
		"/ui/approvals\x7f":            "/ui/",
		"//evil.example/ui/":           "/ui/",
		"/metrics":                     "/ui/",
	} {
		if got := localPath(next, Prefix); got != want {
			t.Errorf("localPath(%q) = %q, want %q", next, got, want)
		}
	}
}

// Characters that would not show as themselves are shown escaped: an approver read
// "DE89\u202e9876-5432\u202c" as an IBAN written backwards, another than the one the
// approval runs with. The escape means the same in JSON; the text stays JSON.
func TestHiddenCharactersShowEscaped(t *testing.T) {
	raw := []byte("{\"iban\":\"DE89\u202e9876-5432\u202c\",\"note\":\"a\u200bb\U000e0041\u2028\",\"eur\":40,\"ok\":\"é€😀\"}")
	for _, got := range []string{prettyJSON(raw), prettyJSON(append([]byte(strings.Repeat(" ", maxPrettyBytes)), raw...))} {
		if strings.ContainsFunc(got, hiddenRune) {
			t.Errorf("shown with a hidden rune: %q", got)
		}
		for _, want := range []string{`DE89\u202e9876-5432\u202c`, `a\u200bb\udb40\udc41\u2028`, `é€😀`} {
			if !strings.Contains(got, want) {
				t.Errorf("%q does not show %s", got, want)
			}
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(got), &v); err != nil || v["iban"] != "DE89\u202e9876-5432\u202c" {
			t.Errorf("the escaped text means something else: %v %v", v, err)
		}
	}
	if !holdsHidden(raw) || holdsHidden([]byte(`{"ok":"é€😀","n":"\u202e"}`)) {
		t.Error("holdsHidden: wrong about which JSON holds hidden runes")
	}
}

// A decide form is offered only on an approval a decision can still land on.
func TestOpenApprovals(t *testing.T) {
	open := funcs["open"].(func(*idemkv.Approval) bool)
	state := funcs["approvalState"].(func(*idemkv.Approval) string)
	later, earlier := idemkv.TimestampOf(time.Now().Add(time.Hour)), idemkv.TimestampOf(time.Now().Add(-time.Second))
	for _, c := range []struct {
		a     *idemkv.Approval
		open  bool
		state string
	}{
		{&idemkv.Approval{State: idemkv.ApprovalWaiting, ExpiresAt: later}, true, "waiting"},
		{&idemkv.Approval{State: idemkv.ApprovalWaiting, ExpiresAt: earlier}, false, "expired unanswered"},
		{&idemkv.Approval{State: idemkv.ApprovalApproved, ExpiresAt: later}, false, "approved"},
		{&idemkv.Approval{State: idemkv.ApprovalDenied, ExpiresAt: later}, false, "denied"},
	} {
		if open(c.a) != c.open || state(c.a) != c.state {
			t.Errorf("%+v: open %v, state %q; want %v, %q", c.a, open(c.a), state(c.a), c.open, c.state)
		}
	}
	if open(nil) {
		t.Error("no approval is open")
	}
}
