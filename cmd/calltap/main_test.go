package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

func runCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb syncBuffer // safe for concurrent writes, as os.Stdout and os.Stderr are: a command's goroutines log while it prints
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := run(ctx, args, Stdio{In: strings.NewReader(""), Out: &out, Err: &errb})
	return code, out.String(), errb.String()
}

func TestUsageErrorsAreOneLineAndExit2(t *testing.T) {
	badRoutes := filepath.Join(t.TempDir(), "routes.toml")
	if err := os.WriteFile(badRoutes, []byte("[[route]]\nname = \"x\"\nevents = [\"*\"]\nforward-to = \"nope\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"nope"},
		{"listen", "--bogus"},
		{"listen", "--relay", "http://x"},
		{"dev"},
		{"dev", "--forward-to", "ftp://x"},
		{"relay", "--listen", "127.0.0.1:0"},
		{"relay", "token", "create", "--data", t.TempDir()},
		{"relay", "token", "frobnicate"},
		{"replay"},
		{"dev", "--forward-to", "http://127.0.0.1:3000", "--inspect", "0.0.0.0:4040"},
		{"requests", "--limit", "x"},
		{"requests", "--status", "7xx", "--data", t.TempDir()},
		{"relay", "--sync", "sometimes"},
		{"dev", "--forward-to", "http://127.0.0.1:3000", "--sync", "off"},
		{"listen", "--relay", "http://x", "--token", "t", "--forward-to", "http://127.0.0.1:3000", "--sync", ""},
		{"dev", "--events", "call.["},
		{"dev", "--routes", badRoutes},
		{"listen", "--relay", "http://x", "--token", "t", "--routes", filepath.Join(t.TempDir(), "absent.toml")},
	} {
		code, _, stderr := runCmd(t, args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
		if n := strings.Count(strings.TrimRight(stderr, "\n"), "\n"); n != 0 || stderr == "" {
			t.Errorf("%v: want one line on stderr, got %q", args, stderr)
		}
		if slices.Contains(args, badRoutes) && !strings.Contains(stderr, "routes.toml:4: ") {
			t.Errorf("a bad route file at start: %q does not name the file and the line", stderr)
		}
	}
}

func TestHelpOnEveryCommand(t *testing.T) {
	for name, c := range commands() {
		if c.run == nil {
			continue
		}
		args := []string{name, "-h"}
		if name == "relay" {
			args = []string{"relay", "-h"}
		}
		code, stdout, _ := runCmd(t, args...)
		if code != 0 || !strings.Contains(stdout, "Usage:") {
			t.Errorf("%s -h: exit %d, output %q", name, code, stdout)
		}
	}
	code, stdout, _ := runCmd(t, "relay", "token", "-h")
	if code != 0 || !strings.Contains(stdout, "create") {
		t.Errorf("relay token -h: %d %q", code, stdout)
	}
}

func TestTokenCommands(t *testing.T) {
	dir := t.TempDir()
	code, stdout, stderr := runCmd(t, "relay", "token", "create", "alice", "--data", dir, "--public-url", "https://relay.example.com", "--json")
	if code != 0 {
		t.Fatalf("create: %d %s", code, stderr)
	}
	var info struct{ Name, Token, TunnelID, URL string }
	var raw map[string]string
	json.Unmarshal([]byte(stdout), &raw)
	info.Name, info.Token, info.TunnelID, info.URL = raw["name"], raw["token"], raw["tunnel_id"], raw["url"]
	if info.Name != "alice" || !strings.HasPrefix(info.Token, "ct_") || len(info.TunnelID) != 32 || info.URL != "https://relay.example.com/t/"+info.TunnelID {
		t.Fatalf("create --json: %s", stdout)
	}
	if code, _, _ := runCmd(t, "relay", "token", "create", "alice", "--data", dir); code != 1 {
		t.Errorf("duplicate name: exit %d", code)
	}
	code, stdout, _ = runCmd(t, "relay", "token", "list", "--data", dir)
	if code != 0 || !strings.Contains(stdout, "alice") || !strings.Contains(stdout, "active") || strings.Contains(stdout, info.Token) {
		t.Errorf("list: %d %q", code, stdout)
	}
	if code, _, _ := runCmd(t, "relay", "token", "revoke", "alice", "--data", dir); code != 0 {
		t.Errorf("revoke: %d", code)
	}
	code, stdout, _ = runCmd(t, "relay", "token", "list", "--data", dir, "--json")
	if code != 0 || !strings.Contains(stdout, `"revoked_at":"`) {
		t.Errorf("list after revoke: %s", stdout)
	}
}

func TestListenExitsOnWrongToken(t *testing.T) {
	h := httptest.NewServer(nil)
	defer h.Close()
	st := stacktest.Start(t, stacktest.Options{ForwardTo: h.URL, NoAgent: true})
	code, _, stderr := runCmd(t, "listen", "--relay", st.RelayURL, "--token", "ct_wrong", "--forward-to", h.URL, "--inspect", "", "--data", t.TempDir())
	if code != 1 || !strings.Contains(stderr, "refused the token") {
		t.Fatalf("listen with a wrong token: exit %d, %q", code, stderr)
	}
}

// --sync reaches the store: durable unless normal is asked for.
func TestSyncFlagOpensStoreSo(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want storage.SyncMode
	}{{nil, storage.SyncFull}, {[]string{"--sync", "normal"}, storage.SyncNormal}, {[]string{"--sync", "FULL"}, storage.SyncFull}} {
		fs := newFlagSet("listen", "", "")
		var f syncFlag
		f.register(fs)
		if ok, _ := parseFlags(fs, tc.args, Stdio{Out: io.Discard, Err: io.Discard}); !ok {
			t.Fatalf("%v refused", tc.args)
		}
		agentStore, err := agentDB(context.Background(), t.TempDir(), agentdb.WithSync(f.syncMode()))
		if err != nil {
			t.Fatal(err)
		}
		relayStore, err := relayDB(context.Background(), t.TempDir(), storage.WithSync(f.syncMode()))
		if err != nil {
			t.Fatal(err)
		}
		for _, got := range []storage.SyncMode{agentStore.SyncMode(), relayStore.SyncMode()} {
			if got != tc.want {
				t.Errorf("%v: store opened %s, want %s", tc.args, got, tc.want)
			}
		}
		agentStore.Close()
		relayStore.Close()
	}
}
