package client

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// TestConfigDocsStateDefaults: every field of Config and RunConfig says its default
// in its doc comment, so that go doc ./client answers "what happens if I leave this
// zero" (issue 14, point 4: Timeout, MaxAttempts, LeaseTTL, PollWait, CommitGrace
// did not).
func TestConfigDocsStateDefaults(t *testing.T) {
	fset := token.NewFileSet()
	checked := 0
	for _, file := range []string{"client.go", "do.go"} {
		f, err := parser.ParseFile(fset, file, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || (ts.Name.Name != "Config" && ts.Name.Name != "RunConfig") {
				return true
			}
			st := ts.Type.(*ast.StructType)
			// A doc comment may cover a run of fields declared together (BackoffMin
			// and BackoffMax): the last comment seen applies.
			var doc string
			for _, field := range st.Fields.List {
				if field.Doc != nil {
					doc = field.Doc.Text()
				}
				for _, name := range field.Names {
					checked++
					if !strings.Contains(strings.ToLower(doc), "default") {
						t.Errorf("%s.%s: the doc comment states no default: %q", ts.Name.Name, name.Name, doc)
					}
				}
			}
			return false
		})
	}
	if checked < 20 {
		t.Fatalf("checked %d fields; the parse missed the configs", checked)
	}
}
