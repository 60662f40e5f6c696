package main

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Reading never needs room: requests and export work on a full disk and
// on a read-only copy of the data directory, of a store an agent closed
// and of one whose agent was killed (its WAL and intake log left as they
// were). Each case runs in a mount namespace of its own (unshare), on a
// tmpfs: remounted read-only, or filled. File modes would not do: the
// tests may run as root, whom they do not stop.
func TestReadingNeedsNoRoom(t *testing.T) {
	const n = 6
	stores := map[string]string{}
	for _, how := range []string{"closed", "killed"} {
		h := httptest.NewServer(&counter{})
		dir := filepath.Join(t.TempDir(), "data")
		p, tunnel := devOn(t, dir, h.URL)
		for i := range n {
			if code := postStatus(tunnel, fmt.Sprintf(`{"n":%d}`, i)); code != 200 {
				t.Fatalf("send %d: %d", i, code)
			}
		}
		if how == "closed" {
			stop(t, p, syscall.SIGTERM)
		} else {
			p.cmd.Process.Signal(syscall.SIGKILL)
			p.cmd.Wait()
		}
		h.Close()
		stores[how] = dir
	}
	for _, disk := range []string{"read-only", "full"} {
		for _, how := range []string{"closed", "killed"} {
			t.Run(disk+"/"+how, func(t *testing.T) {
				out := readOnDisk(t, stores[how], disk)
				listed := checkRead(t, out, "requests", n)
				exported := checkRead(t, out, "export", n)
				if how == "closed" && (listed != n || exported != n) {
					t.Errorf("listed %d and exported %d captures of a closed store; want %d", listed, exported, n)
				}
			})
		}
	}
}

// readOnDisk copies the data directory src onto a tmpfs, makes it
// read-only or full, runs requests and export on it and returns the
// folder holding their output (<cmd>.out, .err, .code) and "changed",
// which lists what the commands changed in the copy.
func readOnDisk(t *testing.T, src, disk string) string {
	t.Helper()
	mnt, out := t.TempDir(), t.TempDir()
	script := `set -eu
mount -t tmpfs -o size=64m tmpfs "$MNT"
cp -a "$SRC/." "$MNT/"
if [ "$DISK" = read-only ]; then
  mount -o remount,ro "$MNT"
else
  dd if=/dev/zero of="$MNT/fill" bs=64k 2>/dev/null || true
  dd if=/dev/zero of="$MNT/fill2" bs=512 2>/dev/null || true
  if head -c 4096 /dev/zero > "$MNT/room" 2>/dev/null; then echo "the disk is not full" >&2; exit 1; fi
  rm -f "$MNT/room"
fi
ls -la --time-style=+%s.%N "$MNT" "$MNT/agent-bodies" > "$OUT/before"
for cmd in requests export; do
  set +e
  if [ $cmd = requests ]; then "$BIN" requests --data "$MNT" --json --limit 200; else "$BIN" export --data "$MNT"; fi > "$OUT/$cmd.out" 2> "$OUT/$cmd.err"
  echo $? > "$OUT/$cmd.code"
  set -e
done
ls -la --time-style=+%s.%N "$MNT" "$MNT/agent-bodies" > "$OUT/after"
`
	cmd := exec.Command("unshare", "--mount", "--map-root-user", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "MNT="+mnt, "SRC="+src, "OUT="+out, "DISK="+disk, "BIN="+calltapBinary(t))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s disk: %v\n%s", disk, err, b)
	}
	// The -shm files are SQLite's shared memory, which every reader of a
	// WAL database writes (its read marks) in pages that exist already.
	listing := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(out, name))
		var keep []string
		for _, l := range strings.Split(string(b), "\n") {
			if !strings.HasSuffix(l, "-shm") {
				keep = append(keep, l)
			}
		}
		return strings.Join(keep, "\n")
	}
	if before, after := listing("before"), listing("after"); before != after {
		t.Errorf("reading changed the data directory:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	return out
}

var leftOut = regexp.MustCompile(`leaves out (\d+) request\(s\)`)

// checkRead checks that cmd exited 0 and returns how many captures it
// printed; those it said it left out make up the rest of want.
func checkRead(t *testing.T, out, cmd string, want int) int {
	t.Helper()
	read := func(ext string) string {
		b, _ := os.ReadFile(filepath.Join(out, cmd+"."+ext))
		return string(b)
	}
	stdout, stderr := read("out"), read("err")
	missing := 0
	if m := leftOut.FindStringSubmatch(stderr); m != nil {
		missing, _ = strconv.Atoi(m[1])
	}
	code := strings.TrimSpace(read("code"))
	if cmd == "export" && missing == want && code == "1" && strings.HasSuffix(stderr, "nothing to export\n") {
		return 0 // left out, all of them: an empty selection, as ever
	}
	if code != "0" {
		t.Fatalf("%s: exit %s, stderr %q", cmd, code, stderr)
	}
	var got int
	if cmd == "requests" {
		var page struct{ Count int }
		if err := json.Unmarshal([]byte(stdout), &page); err != nil {
			t.Fatalf("requests: %v: %q", err, stdout)
		}
		got = page.Count
	} else {
		got = strings.Count(stdout, "\n") - 1 // the first line names the format
	}
	if missing == 0 && stderr != "" {
		t.Errorf("%s: stderr %q", cmd, stderr)
	}
	if got+missing != want {
		t.Errorf("%s printed %d captures and said it left out %d; want %d in all (stderr %q)", cmd, got, missing, want, stderr)
	}
	return got
}
