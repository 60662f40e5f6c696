package main

import (
	"context"
	"fmt"
	"io/fs"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// devOn starts `calltap dev` on dir in front of a handler and waits for
// its tunnel; it returns the process and the tunnel's URL.
func devOn(t *testing.T, dir, forwardTo string) (*proc, string) {
	t.Helper()
	inspect := freeAddr(t)
	p := start(t, "dev", "--forward-to", forwardTo, "--listen", freeAddr(t), "--inspect", inspect, "--data", dir, "--quiet")
	waitConnected(t, inspect)
	return p, tunnelURL(t, p)
}

// One agent per data directory: a second dev on it is refused with one
// line naming the first (its pid and command), exit 1, and opens nothing;
// once the first is killed (SIGKILL: no chance to clean up) the kernel has
// dropped its lock and a new dev starts.
func TestSecondAgentOnADataDirIsRefused(t *testing.T) {
	h := httptest.NewServer(&counter{})
	defer h.Close()
	dir := filepath.Join(t.TempDir(), "data")
	first, _ := devOn(t, dir, h.URL)
	pid := first.cmd.Process.Pid

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	second := exec.CommandContext(ctx, calltapBinary(t), "dev", "--forward-to", h.URL, "--listen", freeAddr(t), "--inspect", freeAddr(t), "--data", dir)
	var out, errb syncBuffer
	second.Stdout, second.Stderr = &out, &errb
	err := second.Run()
	code := second.ProcessState.ExitCode()
	stderr := errb.String()
	if code != 1 || out.String() != "" {
		t.Fatalf("second dev: exit %d (%v), stdout %q, stderr %q; want exit 1 and one line", code, err, out.String(), stderr)
	}
	if strings.Count(strings.TrimRight(stderr, "\n"), "\n") != 0 || !strings.Contains(stderr, fmt.Sprintf("pid %d", pid)) || !strings.Contains(stderr, "calltap dev") || !strings.Contains(stderr, dir) {
		t.Errorf("second dev said %q; want one line naming %s and the holder: calltap dev, pid %d", stderr, dir, pid)
	}

	first.cmd.Process.Signal(syscall.SIGKILL)
	first.cmd.Wait()
	devOn(t, dir, h.URL) // the lock went with the process
}

// The store is its owner's alone: the data directory is 0700 and every
// file in it 0600, whatever the umask, SQLite's -wal and -shm included;
// a directory found open to others is made private, with one warning.
func TestDataDirIsPrivate(t *testing.T) {
	old := syscall.Umask(0o022) // the usual umask; restored below
	defer syscall.Umask(old)
	h := httptest.NewServer(&counter{})
	defer h.Close()
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p, tunnel := devOn(t, dir, h.URL)
	for i := range 3 {
		if code := postStatus(tunnel, fmt.Sprintf(`{"n":%d}`, i)); code != 200 {
			t.Fatalf("send: %d", code)
		}
	}
	// Read while it runs: the WAL and shared-memory files exist now.
	if code, _, stderr := runCmd(t, "requests", "--data", dir); code != 0 {
		t.Fatalf("requests: exit %d: %s", code, stderr)
	}
	checkPrivate(t, dir)
	stop(t, p, syscall.SIGTERM)
	checkPrivate(t, dir)
	if n := strings.Count(p.out.String(), "open to other users"); n != 1 {
		t.Errorf("dev warned %d times of the directory's mode; want once:\n%s", n, p.out.String())
	}
}

func checkPrivate(t *testing.T, dir string) {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		want := fs.FileMode(0o600)
		if d.IsDir() {
			want = 0o700
		}
		files = append(files, filepath.Base(path))
		if fi.Mode().Perm() != want {
			t.Errorf("%s is %04o, want %04o", path, fi.Mode().Perm(), want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"agent.db", "agent.db-wal", "agent-search.db", "relay.db", "dev-token", agentLockFile} {
		found := false
		for _, f := range files {
			found = found || f == want
		}
		if !found && !strings.HasSuffix(want, "-wal") {
			t.Errorf("%s is not in %s (%v)", want, dir, files)
		}
	}
}
