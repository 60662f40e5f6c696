package mediasave

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

// mediaHost serves a call's media: a recording, a transcript, a link that
// expired, one busy once, one too large.
func mediaHost(t *testing.T) *httptest.Server {
	var mu sync.Mutex
	busy := 0
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/rec":
			w.Header().Set("Content-Type", "audio/mpeg")
			w.Write([]byte("mp3 bytes"))
		case "/t.txt":
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Write([]byte("hello"))
		case "/gone":
			w.WriteHeader(http.StatusGone)
		case "/busy":
			mu.Lock()
			busy++
			n := busy
			mu.Unlock()
			if n == 1 {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			w.Write([]byte("at last"))
		case "/big":
			w.Write([]byte(strings.Repeat("x", 2000)))
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(hs.Close)
	return hs
}

func mediaOf(t *testing.T, db *agentdb.AgentStore, captureID string) map[string]*agentdb.MediaFile {
	t.Helper()
	files, _, err := db.MediaFiles(context.Background(), agentdb.MediaFilter{CaptureID: captureID, Page: storage.Page{Limit: 10}})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*agentdb.MediaFile{}
	for _, f := range files {
		out[f.Kind] = f
	}
	return out
}

// The media a call event links are downloaded beside the store, under a
// name with the file's kind, with their size and digest; a link that
// cannot serve is recorded failed with why; a busy one is tried again.
func TestMediaSaverDownloads(t *testing.T) {
	hs := mediaHost(t)
	db := openStore(t)
	dir := t.TempDir()
	var updates sync.Map
	s := newSaver(t, Config{DB: db, Dir: dir, AllowPrivate: true, MaxBytes: 1000,
		Backoff: []time.Duration{time.Millisecond}, Logger: quiet,
		OnUpdate: func(f *agentdb.MediaFile) { updates.Store(f.ID, f.Status) }})
	caps := map[string]*agentdb.Capture{}
	for _, name := range []string{"ok", "gone", "busy", "big", "bad", "sample"} {
		caps[name] = writeCapture(t, db, testCapture(`{}`))
	}
	ctx := context.Background()
	s.Save(ctx, caps["ok"].ID, "call-1", callevent.Media{RecordingURL: hs.URL + "/rec", TranscriptURL: hs.URL + "/t.txt", ExpiresIn: 60})
	s.Save(ctx, caps["gone"].ID, "call-1", callevent.Media{RecordingURL: hs.URL + "/gone"})
	s.Save(ctx, caps["busy"].ID, "call-1", callevent.Media{RecordingURL: hs.URL + "/busy"})
	s.Save(ctx, caps["big"].ID, "call-1", callevent.Media{RecordingURL: hs.URL + "/big"})
	s.Save(ctx, caps["bad"].ID, "call-1", callevent.Media{RecordingURL: "ftp://host/x"})
	s.Save(ctx, caps["sample"].ID, "call-1", callevent.Media{RecordingURL: "https://cdn.example.com/a.mp3"})
	s.Wait()

	ok := mediaOf(t, db, caps["ok"].ID)
	rec, tr := ok[agentdb.MediaRecording], ok[agentdb.MediaTranscript]
	if rec == nil || tr == nil {
		t.Fatalf("media of the call: %v", ok)
	}
	sum := sha256.Sum256([]byte("mp3 bytes"))
	if rec.Status != agentdb.MediaSaved || rec.Size != 9 || rec.SHA256 != hex.EncodeToString(sum[:]) || !strings.HasSuffix(rec.File, ".mp3") ||
		rec.ContentType != "audio/mpeg" || rec.Attempts != 1 || rec.ExpiresAt.IsZero() {
		t.Errorf("recording: %+v", rec)
	}
	if b, err := os.ReadFile(filepath.Join(dir, rec.File)); err != nil || string(b) != "mp3 bytes" {
		t.Errorf("the recording's file: %q, %v", b, err)
	}
	if tr.Status != agentdb.MediaSaved || !strings.HasSuffix(tr.File, ".txt") {
		t.Errorf("transcript: %+v", tr)
	}
	if _, seen := updates.Load(rec.ID); !seen {
		t.Error("OnUpdate was not told of the download")
	}
	for name, want := range map[string]string{
		"gone":   "HTTP 410: the signed link may have expired; `calltap media call-1`",
		"big":    "larger than 1000 bytes",
		"bad":    "not an http(s) URL",
		"sample": "a sample link: cdn.example.com",
	} {
		f := mediaOf(t, db, caps[name].ID)[agentdb.MediaRecording]
		if f == nil || f.Status != agentdb.MediaFailed || !strings.HasPrefix(f.Error, want) {
			t.Errorf("%s: %+v, want failed with %q", name, f, want)
		}
	}
	busy := mediaOf(t, db, caps["busy"].ID)[agentdb.MediaRecording]
	if busy == nil || busy.Status != agentdb.MediaSaved || busy.Attempts != 2 {
		t.Errorf("busy once: %+v, want saved at the second attempt", busy)
	}

	// A replay's body points at the saved copies.
	body := []byte(`{"event":"call.analysis_completed","call":{"call_id":"call-1"},"media":{"recording_url":"` + hs.URL + `/rec","transcript_url":"` + hs.URL + `/t.txt"}}`)
	out, n, err := RewriteLinks(ctx, db, body, "http://127.0.0.1:4040/")
	if err != nil || n != 2 || !strings.Contains(string(out), `"http://127.0.0.1:4040`+URLPath(rec.ID)+`"`) {
		t.Errorf("rewritten %d links (%v): %s", n, err, out)
	}
}

// A call event's media are saved from its capture, unless it is a
// duplicate or an event that links none; a saver that forbids private
// addresses does not fetch from one; a closed saver starts nothing.
func TestMediaSaverFromCaptures(t *testing.T) {
	hs := mediaHost(t)
	db := openStore(t)
	if _, err := New(Config{DB: db}); err == nil {
		t.Error("a saver without a directory was made")
	}
	s, err := New(Config{DB: db, Dir: t.TempDir(), Backoff: []time.Duration{}})
	if err != nil {
		t.Fatal(err)
	}
	capture := func(event, dup string) *agentdb.Capture {
		c := testCapture(`{"event":"` + event + `","call":{"call_id":"call-2"},"media":{"recording_url":"` + hs.URL + `/rec"}}`)
		c.Event, c.DuplicateOf = event, dup
		return writeCapture(t, db, c)
	}
	saved := capture(callevent.KindRecordingAvailable, "")
	dup := capture(callevent.KindRecordingAvailable, saved.ID)
	other := capture(callevent.KindEnded, "")
	for _, c := range []*agentdb.Capture{saved, dup, other} {
		s.SaveCapture(c)
	}
	s.Wait()
	f := mediaOf(t, db, saved.ID)[agentdb.MediaRecording]
	if f == nil || f.CallID != "call-2" || f.Status != agentdb.MediaFailed || !strings.Contains(f.Error, "private address") {
		t.Errorf("a loopback link with private addresses forbidden: %+v", f)
	}
	if len(mediaOf(t, db, dup.ID))+len(mediaOf(t, db, other.ID)) != 0 {
		t.Error("media saved for a duplicate or an event without media")
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	late := capture(callevent.KindAnalysisCompleted, "")
	s.SaveCapture(late)
	s.Wait()
	if len(mediaOf(t, db, late.ID)) != 0 {
		t.Error("a closed saver started a download")
	}
}

func TestMediaLinksAndNames(t *testing.T) {
	for data, want := range map[string]callevent.Media{
		`"https://a/r.mp3"`:                         {RecordingURL: "https://a/r.mp3"},
		`{"media":{"recording_url":"https://a/1"}}`: {RecordingURL: "https://a/1"},
		`{"signed_url":"https://a/2","transcript":"https://a/t","expires_in":30}`: {RecordingURL: "https://a/2", TranscriptURL: "https://a/t", ExpiresIn: 30},
		`{"media":{},"download_url":"https://a/3"}`:                               {RecordingURL: "https://a/3"},
		`[1,2]`: {},
	} {
		got := ParseLinks(json.RawMessage(data))
		if got.RecordingURL != want.RecordingURL || got.TranscriptURL != want.TranscriptURL || got.ExpiresIn != want.ExpiresIn {
			t.Errorf("ParseLinks(%s) = %+v, want %+v", data, got, want)
		}
	}
	for _, c := range []struct{ link, ctype, want string }{
		{"https://a/r.WAV", "", ".wav"},
		{"https://a/r", "audio/mpeg", ".mp3"},
		{"https://a/r", "audio/x-wav", ".wav"},
		{"https://a/r", "audio/opus", ".ogg"},
		{"https://a/r", "audio/mp4", ".m4a"},
		{"https://a/r", "application/json", ".json"},
		{"https://a/r.toolongext", "text/plain", ".txt"},
		{"https://a/r", "image/png", ".bin"},
	} {
		if got := fileExt(c.link, c.ctype); got != c.want {
			t.Errorf("fileExt(%s, %s) = %s, want %s", c.link, c.ctype, got, c.want)
		}
	}
	for host, want := range map[string]bool{"example.com": true, "a.example.org.": true, "x.test": true, "invalid": true, "notexample.com": false, "service.io": false} {
		if isSampleHost(host) != want {
			t.Errorf("isSampleHost(%s) = %v", host, !want)
		}
	}
	for st, want := range map[int]bool{200: false, 299: false, 500: true, 503: true, 404: false, 401: false} {
		retry, err := statusError(st, "c")
		if retry != want || (err == nil) != (st < 300) {
			t.Errorf("statusError(%d) = %v, %v", st, retry, err)
		}
	}
}
