package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
)

// The retention and sweeper settings of `idemkv serve` reach the node from flags and
// from IDEMKV_* variables alike: the bounds they set are what the HTTP API enforces,
// and the sweeper they configure deletes what expires.
func TestRetentionFlagsAndEnvironment(t *testing.T) {
	httpAddr := serveNode(t, []string{"IDEMKV_MAX_TTL=48h", "IDEMKV_MAX_LEASE_TTL=30m"},
		"--default-ttl", "2h", "--min-ttl", "1s", "--default-lease-ttl", "20s", "--min-lease-ttl", "500ms",
		"--sweep-interval", "100ms", "--sweep-batch", "16")

	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	reserve := func(key string, extra map[string]any) (int, idemkv.ReserveResult, idemkv.Error) {
		t.Helper()
		body := map[string]any{"tenant": "acme", "idempotency_key": key, "tool": "t", "effect_fingerprint": "sha256:" + key}
		for k, v := range extra {
			body[k] = v
		}
		code, raw := call(t, http.MethodPost, httpAddr, "/v1/reserve", body)
		var res idemkv.ReserveResult
		var e struct {
			Error idemkv.Error `json:"error"`
		}
		if code == http.StatusOK {
			if err := json.Unmarshal(raw, &res); err != nil {
				t.Fatalf("%s: %v: %s", key, err, raw)
			}
		} else if err := json.Unmarshal(raw, &e); err != nil {
			t.Fatalf("%s: %d %v: %s", key, code, err, raw)
		}
		return code, res, e.Error
	}

	code, res, _ := reserve("defaults", nil)
	if code != http.StatusOK {
		t.Fatalf("reserve with defaults: %d", code)
	}
	r := res.Record
	if ttl, lease := r.ExpiresAt.Time().Sub(r.CreatedAt.Time()), r.LeaseExpiresAt.Time().Sub(r.CreatedAt.Time()); ttl != 2*time.Hour || lease != 20*time.Second {
		t.Errorf("defaults from the flags: retained %s with a lease of %s, want 2h and 20s", ttl, lease)
	}
	if code, _, _ := reserve("at-max", map[string]any{"ttl_ms": ms(48 * time.Hour), "lease_ttl_ms": ms(30 * time.Minute)}); code != http.StatusOK {
		t.Errorf("ttl and lease at the maxima from the environment: %d", code)
	}
	for _, c := range []struct {
		name  string
		extra map[string]any
		field string
	}{
		{"ttl above IDEMKV_MAX_TTL", map[string]any{"ttl_ms": ms(49 * time.Hour)}, "ttl_ms"},
		{"lease above IDEMKV_MAX_LEASE_TTL", map[string]any{"lease_ttl_ms": ms(31 * time.Minute)}, "lease_ttl_ms"},
		{"ttl below --min-ttl", map[string]any{"ttl_ms": 500, "lease_ttl_ms": 500}, "ttl_ms"},
		{"lease below --min-lease-ttl", map[string]any{"lease_ttl_ms": 400}, "lease_ttl_ms"},
		{"ttl shorter than the lease", map[string]any{"ttl_ms": ms(15 * time.Minute), "lease_ttl_ms": ms(20 * time.Minute)}, "ttl_ms"},
	} {
		code, _, e := reserve("refused", c.extra)
		if code != http.StatusBadRequest || e.Code != idemkv.CodeInvalidArgument || e.Field != c.field {
			t.Errorf("%s: %d %+v, want 400 naming %s", c.name, code, e, c.field)
		}
	}

	// Records kept for a second expire for real, and the sweeper configured by the
	// flags deletes them.
	const short = 40
	for i := range short {
		if code, _, e := reserve(fmt.Sprintf("short-%02d", i), map[string]any{"ttl_ms": 1000, "lease_ttl_ms": 500}); code != http.StatusOK {
			t.Fatalf("short-lived record: %d %+v", code, e)
		}
	}
	waitFor(t, 30*time.Second, "the sweeper deletes the expired records", func() error {
		if got := metricLine(t, httpAddr, "idemkv_expiry_swept_records_total"); got != short {
			return fmt.Errorf("swept %v", got)
		}
		return nil
	})
	for i := range short {
		key := fmt.Sprintf("short-%02d", i)
		if code, raw := call(t, http.MethodGet, httpAddr, "/v1/records/acme/"+url.PathEscape(key), nil); code != http.StatusNotFound {
			t.Errorf("%s after its expiry: %d %s", key, code, raw)
		}
	}
	if code, raw := call(t, http.MethodGet, httpAddr, "/v1/records/acme/defaults", nil); code != http.StatusOK {
		t.Errorf("a record retained for 2h was swept: %d %s", code, raw)
	}
}

// metricLine reads one unlabelled sample from /metrics.
func metricLine(t *testing.T, httpAddr, name string) float64 {
	t.Helper()
	code, raw := call(t, http.MethodGet, httpAddr, "/metrics", nil)
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", sc.Text(), err)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no %s", name)
	return 0
}

// Retention settings that contradict each other, from flags or from the environment,
// stop `idemkv serve` before it creates anything.
func TestServeRefusesContradictoryRetention(t *testing.T) {
	for _, c := range []struct {
		name  string
		flags []string
		env   [2]string
	}{
		{"default ttl shorter than the default lease", []string{"--default-ttl", "1m", "--default-lease-ttl", "2m"}, [2]string{}},
		{"min ttl above max ttl", []string{"--min-ttl", "2h", "--max-ttl", "1h", "--default-ttl", "1h"}, [2]string{}},
		{"default ttl below the minimum, from the environment", nil, [2]string{"IDEMKV_DEFAULT_TTL", "30s"}},
		{"no connection allowed", []string{"--max-conns-per-source", "0"}, [2]string{}},
		// A negative minimum let non-positive leases through to the state machine.
		{"negative min lease ttl", []string{"--min-lease-ttl", "-1s"}, [2]string{}},
		{"negative min ttl", []string{"--min-ttl", "-1m"}, [2]string{}},
		{"a negative sweep batch", []string{"--sweep-batch", "-5"}, [2]string{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.env[0] != "" {
				t.Setenv(c.env[0], c.env[1])
			}
			dir := filepath.Join(t.TempDir(), "data")
			args := append([]string{"serve", "--data-dir", dir, "--http-addr", "127.0.0.1:0", "--raft-addr", "127.0.0.1:0"}, c.flags...)
			if _, err := cli(t, args...); err == nil {
				t.Fatal("serve started")
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("data dir created (%v) by a serve that refused to start", err)
			}
		})
	}
}

// serveNode runs `idemkv serve` as a single node n1 with args, the environment
// with env added, until the test ends, and returns its API address once it is ready.
func serveNode(t *testing.T, env []string, args ...string) string {
	t.Helper()
	httpAddr := freePort(t)
	cmd := exec.Command(idemkvBinary(t), append([]string{"serve", "--id", "n1", "--data-dir", filepath.Join(t.TempDir(), "n1"),
		"--http-addr", httpAddr, "--raft-addr", freePort(t)}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	logs := newLineLog(t, "n1")
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	waitFor(t, 30*time.Second, "ready", func() error { return readyPlain(httpAddr) })
	return httpAddr
}
