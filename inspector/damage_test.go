package inspector_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/inspectortest"
	"github.com/calltap/calltap/storage/agentdb"
)

// A store damaged inside answers the inspector's listing with an envelope
// that names the file and how to recover it, not a bare internal error.
func TestDamagedStoreAnswersClearly(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "agent.db")
	db, err := agentdb.OpenAgent(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	var cs []*agentdb.Capture
	for i := range 2000 {
		id := fmt.Sprintf("0193a1b2-0000-7000-8000-%012d", i)
		cs = append(cs, &agentdb.Capture{ID: id, Source: "tunnel", CreatedAt: time.Unix(1795335117, 0).UTC(), Method: "POST", Path: "/voice",
			Body: []byte(strings.Repeat("lorem ipsum dolor sit amet ", 70)), Target: "http://127.0.0.1:3000/voice", Duration: -1})
	}
	if _, err := db.WriteCaptures(ctx, cs, nil); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt(bytes.Repeat([]byte{0x5a}, int(fi.Size()/2)), fi.Size()/4)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}

	inspectorURL, _ := startInspector(t, dir)
	status, env := inspectortest.Do(t, "GET", inspectorURL+"/api/v1/ext/webhooks/", "")
	if status != http.StatusInternalServerError || env.Error == nil || env.Error.Code != "store_damaged" {
		t.Fatalf("listing a damaged store: %d %+v", status, env)
	}
	for _, want := range []string{path, "sqlite3 " + path + " .recover"} {
		if !strings.Contains(env.Error.Message, want) || !strings.Contains(env.Message, want) {
			t.Errorf("answer %+v does not say %q", env, want)
		}
	}
}
