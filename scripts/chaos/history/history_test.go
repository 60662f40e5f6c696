package history_test

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/calltap/calltap/scripts/chaos/history"
	"github.com/calltap/calltap/scripts/chaos/history/historytest"
)

// TestRoundTrip writes a run with the writers, from several goroutines at
// once, and reads back every record whole.
func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	meta := history.Meta{Seed: 42, Mode: history.ModeTeam, Minutes: 30, Started: 1, Ended: 2, Drained: 3,
		Bounds: history.Bounds{AnswerMaxMS: 5000, No2xxMaxMS: 10000},
		Routes: []history.Route{{Name: "media", Events: []string{"call.recording_*"}}, {Name: "alice", Developer: "alice"}}}
	if err := history.WriteMeta(dir, meta); err != nil {
		t.Fatal(err)
	}
	appendConcurrently(t, dir)
	faults := []history.Fault{{Start: 10, End: 20, Kind: history.FaultSigkill, Target: "agent"}}
	if err := historytest.WriteAll(dir, history.FaultsFile, faults); err != nil {
		t.Fatal(err)
	}
	h, err := history.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(h.Meta, meta) {
		t.Errorf("meta = %+v, want %+v", h.Meta, meta)
	}
	if len(h.Sends) != 400 {
		t.Errorf("read %d sends, want 400", len(h.Sends))
	}
	seen := map[string]bool{}
	for _, s := range h.Sends {
		if seen[s.DeliveryID] || !strings.HasSuffix(s.Body, "\"quoted\"") {
			t.Fatalf("bad or repeated send %+v", s)
		}
		seen[s.DeliveryID] = true
	}
	if !reflect.DeepEqual(h.Faults, faults) {
		t.Errorf("faults = %+v", h.Faults)
	}
	if h.Handler != nil || h.Store != nil {
		t.Errorf("missing files read as %v, %v; want empty", h.Handler, h.Store)
	}
}

// appendConcurrently writes 400 sends from 8 goroutines, then checks that a
// closed log refuses more.
func appendConcurrently(t *testing.T, dir string) {
	t.Helper()
	sends, err := history.Create[history.Send](dir, history.SendsFile)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				s := history.Send{Sender: fmt.Sprint("s", g), DeliveryID: fmt.Sprintf("d-%d-%d", g, i),
					Attempt: 1, Status: 200, Body: strings.Repeat("x", 100) + "\n\"quoted\""}
				if err := sends.Append(s); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if err := sends.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sends.Append(history.Send{}); err == nil {
		t.Fatal("append after close succeeded")
	}
}

// TestReadTornLine: a history whose last line is torn is refused, naming the
// file and line, rather than judged without it.
func TestReadTornLine(t *testing.T) {
	dir := t.TempDir()
	if err := history.WriteMeta(dir, history.Meta{Seed: 1}); err != nil {
		t.Fatal(err)
	}
	body := `{"received_at":1,"delivery_id":"a"}` + "\n" + `{"received_at":2,"deliv`
	if err := os.WriteFile(filepath.Join(dir, history.HandlerFile), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := history.Read(dir)
	if err == nil || !strings.Contains(err.Error(), "handler.jsonl line 2") {
		t.Fatalf("Read = %v, want an error naming handler.jsonl line 2", err)
	}
}

// TestReadNoMeta: a folder that is not a run is an error.
func TestReadNoMeta(t *testing.T) {
	if _, err := history.Read(t.TempDir()); err == nil {
		t.Fatal("Read of an empty folder succeeded")
	}
}
