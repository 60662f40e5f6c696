package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/storage/agentdb"
)

// tornIntakeStore makes an agent's data folder as a power cut leaves it
// just after the agent made its next intake log ahead: three captures
// saved in log N, a record after them torn (its header written, most of
// its payload not), and log N+1 empty. It returns the folder and the
// captures' ids.
func tornIntakeStore(t *testing.T) (string, []string) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "agent.db")
	db, err := agentdb.OpenAgent(ctx, path, agentdb.WithIntake())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 3 {
		c := &agentdb.Capture{ID: fmt.Sprintf("0193a1b2-0000-7000-8000-00000000010%d", i), Source: "tunnel",
			CreatedAt: time.Now().Add(time.Duration(i) * time.Millisecond), // recent: retention keeps them
			Method:    "POST", Path: "/voice",
			RequestHeaders: `[["Content-Type","application/json"]]`, Body: []byte(fmt.Sprintf(`{"torn_test":%d}`, i)), Duration: -1}
		if _, err := db.LogCaptures(ctx, []*agentdb.Capture{c}, nil); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, c.ID)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	logs, err := filepath.Glob(filepath.Join(agentdb.BodiesDir(path), "intake-*.log"))
	if err != nil || len(logs) == 0 {
		t.Fatalf("no intake log (%v)", err)
	}
	last := logs[len(logs)-1]
	data, err := os.ReadFile(last)
	if err != nil {
		t.Fatal(err)
	}
	end := 0 // past the last whole frame: u32 length, u32 checksum, payload
	for end+8 <= len(data) {
		n := int(binary.LittleEndian.Uint32(data[end:]))
		if n == 0 {
			break
		}
		end += 8 + n
	}
	if end == 0 {
		t.Fatalf("%s holds no record", last)
	}
	torn := binary.LittleEndian.AppendUint32(nil, 600)
	torn = binary.LittleEndian.AppendUint32(torn, 0x5eed5eed)
	torn = append(torn, bytes.Repeat([]byte("x"), 300)...) // the other 300 never reached the disk
	f, err := os.OpenFile(last, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(torn, int64(end)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var gen int64
	if _, err := fmt.Sscanf(filepath.Base(last), "intake-%d.log", &gen); err != nil {
		t.Fatal(err)
	}
	next := filepath.Join(filepath.Dir(last), fmt.Sprintf("intake-%016d.log", gen+1))
	if err := os.WriteFile(next, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, ids
}

// Issue 30.1 through the binary: after a power cut tore the last record
// of a log that an empty newer log follows, `calltap export` and
// `calltap listen` both start and keep every saved capture; listen says
// what it cut, export (a reader) changes nothing. (On 7890542 both exited 1: "intake log … is damaged at …, and
// newer logs follow it".)
func TestTornIntakeLogStillStarts(t *testing.T) {
	t.Run("export", func(t *testing.T) {
		dir, ids := tornIntakeStore(t)
		logs, _ := filepath.Glob(filepath.Join(agentdb.BodiesDir(filepath.Join(dir, "agent.db")), "intake-*.log"))
		last := logs[len(logs)-2] // the torn one; an empty newer log follows
		before, err := os.ReadFile(last)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(calltapBinary(t), "export", "--data", dir)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("export: %v\n%s", err, stderr.String())
		}
		for _, id := range ids {
			if !strings.Contains(stdout.String(), id) {
				t.Errorf("the export lacks %s", id)
			}
		}
		// export only reads (issue 30.5): the torn tail is the next
		// agent's to cut, and the log stays as the power cut left it.
		if after, err := os.ReadFile(last); err != nil || !bytes.Equal(after, before) {
			t.Errorf("export changed %s (%v)", last, err)
		}
	})
	t.Run("listen", func(t *testing.T) {
		dir, ids := tornIntakeStore(t)
		rig := newStopRig(t)
		rig.agentDir = dir
		inspect := freeAddr(t)
		agent := rig.startAgent(t, "http://"+freeAddr(t), "--inspect", inspect)
		polltest.Until(t, 60*time.Second, func() bool {
			resp, err := http.Get("http://" + inspect + "/api/v1/ext/webhooks/")
			if err != nil {
				return false
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, id := range ids {
				if !strings.Contains(string(b), id) {
					return false
				}
			}
			return true
		}, "the agent did not start and list the saved captures")
		if out := agent.out.String(); !strings.Contains(out, "cut a torn record") {
			t.Errorf("listen did not say it cut the torn record; output:\n%s", out)
		}
	})
}
