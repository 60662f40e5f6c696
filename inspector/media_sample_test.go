package inspector_test

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/calltap/calltap/inspector/agent/mediasave"
	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/storage/agentdb"
)

// lockedBuffer is a log destination safe for the saver's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The links of sample events (calltap trigger's, on media.example.com) are
// known for samples: recorded as such, never fetched, and no warning about
// a name that does not resolve.
func TestMediaSampleLinksAreNoAlarm(t *testing.T) {
	db := callsOpenDB(t)
	var logs lockedBuffer
	saver, err := mediasave.New(mediasave.Config{DB: db, Dir: filepath.Join(t.TempDir(), "media"),
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		t.Fatal(err)
	}
	defer saver.Close(context.Background())
	p := callevent.CallSpec{}.Events()[4] // call.analysis_completed, with the default links
	if !strings.Contains(p.Media.RecordingURL, "://media.example.com/") {
		t.Fatalf("sample link %q", p.Media.RecordingURL)
	}
	saver.Save(context.Background(), "c", p.Call.CallID, *p.Media)
	saver.Wait()
	files, _, err := db.MediaFiles(context.Background(), agentdb.MediaFilter{CallID: p.Call.CallID})
	if err != nil || len(files) != 2 {
		t.Fatalf("%d files, %v", len(files), err)
	}
	for _, f := range files {
		if f.Status != agentdb.MediaFailed || f.Attempts != 0 || !strings.Contains(f.Error, "sample link") {
			t.Errorf("%s: status %s, %d attempts, error %q; want failed as a sample link, not tried", f.Kind, f.Status, f.Attempts, f.Error)
		}
	}
	if s := logs.String(); s != "" {
		t.Errorf("logged about sample links: %s", s)
	}
}
