package loadgen

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/idemkv/idemkv"
)

func runCommand(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := NewBenchCommand()
	var out, errb bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errb)
	cmd.SetArgs(args)
	cmd.SetContext(t.Context())
	err = cmd.Execute()
	return out.String(), errb.String(), err
}

func TestBenchCommandJSON(t *testing.T) {
	api := newFakeAPI(t, newMemStore())
	out, stderr, err := runCommand(t, "--endpoints", api.addr(), "--concurrency", "4", "--duration", "300ms",
		"--warmup", "0", "--keys", "50", "--json", "--fsync-samples", "5", "--fsync-dir", t.TempDir())
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr)
	}
	var rep Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("output is not a JSON report: %v\n%s", err, out)
	}
	if rep.Target != "idemkv" || rep.Concurrency != 4 || rep.Mix != DefaultMix() || rep.Ops == 0 || rep.Errors != 0 {
		t.Errorf("report %+v", rep)
	}
	var kinds []string
	for _, k := range rep.Kinds {
		kinds = append(kinds, k.Kind)
	}
	if want := statNames[:]; !slices.Equal(kinds, want) {
		t.Errorf("kinds %v, want %v", kinds, want)
	}
	if rep.Fsync == nil || rep.Fsync.Count != 5 || rep.Fsync.P50 <= 0 {
		t.Errorf("fsync probe %+v, want 5 samples", rep.Fsync)
	}
}

func TestBenchCommandText(t *testing.T) {
	api := newFakeAPI(t, newMemStore())
	out, _, err := runCommand(t, "--endpoints", "http://"+api.addr()+"/", "--concurrency", "2", "--ops", "200",
		"--warmup", "0", "--mix", "new=1", "--fsync-samples", "0")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"p99 ms", "new.reserve", "new.commit", "total"} {
		if !strings.Contains(out, want) {
			t.Errorf("text report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\nreplay") || strings.Contains(out, "fsync") {
		t.Errorf("text report shows what did not run:\n%s", out)
	}
	if n := api.served("/v1/commit"); n != 200 {
		t.Errorf("server saw %d commits for --ops 200", n)
	}
}

func TestBenchCommandRejectsBadInput(t *testing.T) {
	if _, _, err := runCommand(t, "--mix", "new=-1"); !errors.Is(err, idemkv.ErrInvalidArgument) {
		t.Errorf("bad mix: %v, want invalid argument", err)
	}
	if _, _, err := runCommand(t, "--endpoints", "127.0.0.1:1", "--fsync-samples", "0"); !errors.Is(err, idemkv.ErrUnavailable) {
		t.Errorf("nothing listening: %v, want unavailable", err)
	}
}

func TestBenchCommandSpread(t *testing.T) {
	store := newMemStore()
	leader, follower := newFakeAPI(t, store), newFakeAPI(t, store)
	addr := leader.addr()
	follower.leader.Store(&addr)
	_, stderr, err := runCommand(t, "--endpoints", leader.addr()+","+follower.addr(), "--spread", "--concurrency", "4",
		"--ops", "400", "--warmup", "0", "--mix", "replay=1", "--keys", "20", "--fsync-samples", "0")
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr)
	}
	// 20 commits and 400 replays, spread over the two nodes by worker.
	if l, f := leader.served("/v1/reserve"), follower.served("/v1/reserve"); l < 150 || f < 150 || l+f != 420 {
		t.Errorf("leader served %d reserves, follower %d; want about 210 each", l, f)
	}
}
