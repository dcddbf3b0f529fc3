package client_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/internal/testlog"
)

// A tool whose result is over the server's payload limit (64 KiB by default) and over
// the 1 MiB body limit: the receipt is stored without the result, with the note, and a
// retry replays it instead of running again. The old Do reported OutcomeUnknown with
// the key left pending (issue 24, point 1): every retry then waited out the lease,
// probed, found the effect and was refused the same commit.
func TestDoStoresOversizedResultAsNote(t *testing.T) {
	c := testcluster.Start(t, 1)
	cl, err := client.New(client.Config{Endpoints: c.Endpoints(), Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	for _, size := range []int{100 << 10, 2 << 20} {
		op := client.Op{Tenant: "acme", Key: "oversized:" + time.Now().Format(time.RFC3339Nano), Tool: "export_report",
			Effect: map[string]any{"report": "q3", "size": size}}
		runs := 0
		fn := func(context.Context) (*client.Result, error) {
			runs++
			return &client.Result{RemoteSystem: "reports", RemoteID: "RPT-7", RemoteURL: "https://reports.example/RPT-7",
				Result: map[string]string{"body": strings.Repeat("x", size)}}, nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := cl.Do(ctx, op, fn)
		if err != nil {
			cancel()
			t.Fatalf("%d-byte result: %v", size, err)
		}
		if !out.ResultOmitted || out.Receipt.RemoteID != "RPT-7" || !client.ResultOmitted(out.Receipt.Result) {
			t.Fatalf("%d-byte result: outcome %+v, want the receipt with the note", size, out)
		}
		var note map[string]map[string]any
		if err := json.Unmarshal(out.Receipt.Result, &note); err != nil || note[client.OmittedResultKey]["bytes"] == nil {
			t.Fatalf("stored result %s is not the note (%v)", out.Receipt.Result, err)
		}
		again, err := cl.Do(ctx, op, fn)
		cancel()
		if err != nil || !again.Replayed || !again.ResultOmitted || again.Receipt.RemoteURL != "https://reports.example/RPT-7" {
			t.Fatalf("retry: %+v, %v; want a replay of the receipt", again, err)
		}
		if runs != 1 {
			t.Fatalf("the tool ran %d times", runs)
		}
		rec, err := cl.Get(context.Background(), &idemkv.GetRequest{Tenant: op.Tenant, Key: op.Key})
		if err != nil || rec.Status != idemkv.StatusCommitted {
			t.Fatalf("record %+v, %v; want committed", rec, err)
		}
	}
}
