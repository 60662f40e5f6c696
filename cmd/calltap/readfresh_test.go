package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/calltap/calltap/storage"

	"github.com/calltap/calltap/storage/agentdb"
)

// A read sees every request already answered, though a running agent
// applies its intake log to SQLite up to 50 ms after the answer: send,
// then at once list (100 rounds out of 100), and at once open the store
// to write, as replay and delete do (20 rounds).
func TestReadsSeeEveryAnsweredRequest(t *testing.T) {
	h := httptest.NewServer(&counter{})
	defer h.Close()
	dir := filepath.Join(t.TempDir(), "data")
	_, tunnel := devOn(t, dir, h.URL)
	for i := range 100 {
		path := fmt.Sprintf("/r%d", i)
		if code := postStatus(tunnel+path, fmt.Sprintf(`{"n":%d}`, i)); code != 200 {
			t.Fatalf("send %d: %d", i, code)
		}
		code, stdout, stderr := runCmd(t, "requests", "--data", dir, "--json", "--limit", "1")
		var page struct {
			Count   int
			Results []struct{ Path string }
		}
		if code != 0 || json.Unmarshal([]byte(stdout), &page) != nil {
			t.Fatalf("round %d: requests: exit %d, stdout %q, stderr %q", i, code, stdout, stderr)
		}
		if page.Count != i+1 || len(page.Results) != 1 || !strings.HasSuffix(page.Results[0].Path, path) {
			t.Fatalf("round %d: requests listed %d capture(s), newest %+v; want %d, the newest %s", i, page.Count, page.Results, i+1, path)
		}
	}
	ctx := context.Background()
	for i := range 20 {
		if code := postStatus(tunnel, fmt.Sprintf(`{"w":%d}`, i)); code != 200 {
			t.Fatalf("send %d: %d", i, code)
		}
		db, err := agentDB(ctx, dir)
		if err != nil {
			t.Fatal(err)
		}
		_, n, err := db.Captures(ctx, agentdb.CaptureFilter{Page: storage.Page{Limit: 1}})
		db.Close()
		if err != nil || n != 100+i+1 {
			t.Fatalf("round %d: a store opened to write holds %d capture(s) (%v); want %d", i, n, err, 100+i+1)
		}
	}
}
