// Package python_test runs the Python client's unittest suite against an idemkv
// binary built from this repository, so that the one test command covers it.
package python_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

func TestPythonClient(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err == nil {
		// The client supports 3.10 and later; an older interpreter cannot run it.
		err = exec.Command(py, "-c", "import sys; sys.exit(sys.version_info < (3, 10))").Run()
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs python3 >= 3.10 for the Python client's tests: %v", err)
		}
		t.Skipf("python3 >= 3.10 not found (%v): the Python client is not tested here", err)
	}

	bin := os.Getenv("IDEMKV_BIN")
	if bin == "" {
		bin = filepath.Join(t.TempDir(), "idemkv")
		build := exec.Command("go", "build", "-o", bin, "./cmd/idemkv")
		build.Dir = filepath.Join("..", "..")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
	}

	start := time.Now()
	cmd := exec.Command(py, "-m", "unittest", "discover", "-v", "-s", "tests", "-t", "tests")
	cmd.Env = append(os.Environ(), "IDEMKV_BIN="+bin, "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	t.Logf("python3 -m unittest discover (%s):\n%s", time.Since(start).Round(time.Millisecond), out.String())
	if err != nil {
		t.Fatalf("the Python client's tests failed: %v", err)
	}
}

// TestPythonTypesStrict runs mypy --strict over the client and tests/typing_probe.py,
// whose deliberate mistakes must each be a type error (issue 24, point 8). CI installs
// Debian's mypy; elsewhere the test skips without it.
func TestPythonTypesStrict(t *testing.T) {
	mypy, err := exec.LookPath("mypy")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs mypy (Debian's mypy package) for the Python client's types: %v", err)
		}
		t.Skipf("mypy not found (%v): the Python client's types are not checked here", err)
	}
	cmd := exec.Command(mypy, "--strict", "--cache-dir", filepath.Join(t.TempDir(), "mypy-cache"), "src/idemkv", "tests/typing_probe.py")
	out, err := cmd.CombinedOutput()
	t.Logf("mypy --strict:\n%s", out)
	if err != nil {
		t.Fatalf("mypy --strict found errors: %v", err)
	}
}
