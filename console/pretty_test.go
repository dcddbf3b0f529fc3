package console

import (
	"strings"
	"testing"
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
