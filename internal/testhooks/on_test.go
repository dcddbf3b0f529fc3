//go:build idemkv_testhooks

package testhooks

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestSettersAndNow(t *testing.T) {
	if !Enabled {
		t.Fatal("hooks not enabled with the build tag")
	}
	t.Cleanup(func() { SetClockOffset(0); SetSabotage(0) })
	SetClockOffset(time.Hour)
	if d := time.Until(Now()); d < 59*time.Minute || d > 61*time.Minute {
		t.Fatalf("Now is %v ahead with a 1h offset", d)
	}
	SetSabotage(IgnoreFences)
	if !Sabotaged(IgnoreFences) || Sabotaged(StaleReads|EarlyAck) {
		t.Fatalf("Sabotaged does not reflect %v", IgnoreFences)
	}
}

func TestEndpoints(t *testing.T) {
	t.Cleanup(func() { SetClockOffset(0); SetSabotage(0) })
	mux := http.NewServeMux()
	Mount(mux, func() (Snapshot, error) { return Snapshot{AppliedIndex: 42, StateHash: "abc"}, nil })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	post := func(body string) (*http.Response, State) {
		t.Helper()
		resp, err := http.Post(srv.URL+PathHooks, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var s State
		_ = json.NewDecoder(resp.Body).Decode(&s)
		return resp, s
	}
	resp, s := post(`{"clock_offset_ms":-30000,"sabotage":["stale-reads","early-ack"]}`)
	if resp.StatusCode != http.StatusOK || s.ClockOffsetMs != -30000 || strings.Join(s.Sabotage, ",") != "stale-reads,early-ack" {
		t.Fatalf("POST answered %d %+v", resp.StatusCode, s)
	}
	if ClockOffset() != -30*time.Second || !Sabotaged(StaleReads) || !Sabotaged(EarlyAck) || Sabotaged(IgnoreFences) {
		t.Fatal("POST did not change the hooks")
	}
	// A partial update leaves the other field alone.
	if _, s = post(`{"sabotage":[]}`); s.ClockOffsetMs != -30000 || len(s.Sabotage) != 0 || Sabotaged(AllModes) {
		t.Fatalf("partial update gave %+v", s)
	}
	if resp, _ = post(`{"sabotage":["drop-tables"]}`); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("unknown mode answered %d", resp.StatusCode)
	}
	if resp, _ = post(`{"offset":1}`); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("unknown field answered %d", resp.StatusCode)
	}

	hr, err := http.Get(srv.URL + PathStateHash)
	if err != nil {
		t.Fatal(err)
	}
	defer hr.Body.Close()
	var snap Snapshot
	if err := json.NewDecoder(hr.Body).Decode(&snap); err != nil || snap.AppliedIndex != 42 || snap.StateHash != "abc" {
		t.Fatalf("state hash answered %+v, %v", snap, err)
	}

	failing := http.NewServeMux()
	Mount(failing, func() (Snapshot, error) { return Snapshot{}, errors.New("closed") })
	w := httptest.NewRecorder()
	failing.ServeHTTP(w, httptest.NewRequest(http.MethodGet, PathStateHash, nil))
	if w.Code != http.StatusInternalServerError {
		t.Fatalf("a failing snapshot answered %d", w.Code)
	}
}

// The environment is read at start, so the check runs in a fresh process.
func TestEnvironmentAtStart(t *testing.T) {
	if os.Getenv("TESTHOOKS_CHILD") == "1" {
		if ClockOffset() != 90*time.Second || !Sabotaged(IgnoreFences) || Sabotaged(StaleReads) {
			os.Exit(3)
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestEnvironmentAtStart$")
	cmd.Env = append(os.Environ(), "TESTHOOKS_CHILD=1", EnvClockOffset+"=90s", EnvSabotage+"=ignore-fences")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child saw other hooks than its environment set: %v\n%s", err, out)
	}

	bad := exec.Command(os.Args[0], "-test.run=^TestEnvironmentAtStart$")
	bad.Env = append(os.Environ(), "TESTHOOKS_CHILD=1", EnvSabotage+"=everything")
	if err := bad.Run(); err == nil {
		t.Fatal("a malformed sabotage variable did not stop the binary")
	}
}
