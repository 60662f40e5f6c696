package inspector_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector"
	"github.com/calltap/calltap/inspector/agent/mediasave"
	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/storage/agentdb"
)

var (
	mediaRecording  = []byte("OggS\x00fake-opus-recording-bytes")
	mediaTranscript = []byte(`[{"speaker":"agent","text":"Hi, this is Ava."}]`)
)

// mediaCDN plays the service's file host on loopback.
type mediaCDN struct {
	hits    sync.Map // path → *atomic.Int32
	flaky   atomic.Int32
	release chan struct{} // /slow waits on it
}

func (c *mediaCDN) count(path string) int32 {
	v, _ := c.hits.LoadOrStore(path, new(atomic.Int32))
	return v.(*atomic.Int32).Load()
}

func (c *mediaCDN) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	v, _ := c.hits.LoadOrStore(r.URL.Path, new(atomic.Int32))
	v.(*atomic.Int32).Add(1)
	switch r.URL.Path {
	case "/calls/rec.ogg":
		w.Header().Set("Content-Type", "audio/ogg")
		w.Write(mediaRecording)
	case "/calls/transcript":
		w.Header().Set("Content-Type", "application/json")
		w.Write(mediaTranscript)
	case "/flaky.ogg":
		if c.flaky.Add(1) <= 2 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "audio/ogg")
		w.Write(mediaRecording)
	case "/expired.ogg":
		http.Error(w, "signature expired", http.StatusForbidden)
	case "/page.html":
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, "<script>alert(1)</script>")
	case "/big.bin":
		w.Write(make([]byte, 4096))
	case "/slow.ogg":
		<-c.release
		w.Write(mediaRecording)
	default:
		http.NotFound(w, r)
	}
}

type mediaEnv struct {
	db     *agentdb.AgentStore
	dir    string
	cdn    *mediaCDN
	cdnURL string
	saver  *mediasave.Saver
	api    string // inspector base URL
	mu     sync.Mutex
	seen   []string // guarded by mu: ids passed to OnUpdate
}

func newMediaEnv(t *testing.T, allowPrivate bool) *mediaEnv {
	t.Helper()
	e := &mediaEnv{db: callsOpenDB(t), dir: filepath.Join(t.TempDir(), "media"), cdn: &mediaCDN{release: make(chan struct{})}}
	cdn := httptest.NewServer(e.cdn)
	t.Cleanup(cdn.Close)
	e.cdnURL = cdn.URL
	saver, err := mediasave.New(mediasave.Config{
		DB: e.db, Dir: e.dir, AllowPrivate: allowPrivate, MaxBytes: 1024,
		Backoff: []time.Duration{5 * time.Millisecond, 5 * time.Millisecond, 5 * time.Millisecond},
		OnUpdate: func(f *agentdb.MediaFile) {
			e.mu.Lock()
			e.seen = append(e.seen, f.ID)
			e.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	e.saver = saver
	t.Cleanup(func() { saver.Close(context.Background()) })
	mux := http.NewServeMux()
	inspector.MediaRoutes(mux, e.db, e.dir)
	inspector.CallRoutes(mux, e.db, 0)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	e.api = srv.URL
	return e
}

func (e *mediaEnv) files(t *testing.T, f agentdb.MediaFilter) []*agentdb.MediaFile {
	t.Helper()
	files, _, err := e.db.MediaFiles(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func (e *mediaEnv) byURL(t *testing.T, u string) *agentdb.MediaFile {
	t.Helper()
	files := e.files(t, agentdb.MediaFilter{SourceURL: u})
	if len(files) != 1 {
		t.Fatalf("%s: %d records", u, len(files))
	}
	return files[0]
}

func TestMediaSaveDownloadsInTheBackground(t *testing.T) {
	e := newMediaEnv(t, true)
	m := callevent.Media{RecordingURL: e.cdnURL + "/calls/rec.ogg?signature=abc", TranscriptURL: e.cdnURL + "/calls/transcript?signature=abc", ExpiresIn: 3600}
	slow := callevent.Media{RecordingURL: e.cdnURL + "/slow.ogg"}

	// Save returns while a download is still blocked on the server.
	done := make(chan struct{})
	go func() {
		e.saver.Save(context.Background(), "cap-slow", "call-slow", slow)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Save blocked on the download")
	}
	close(e.cdn.release)

	ctx, cancel := context.WithCancel(context.Background())
	e.saver.Save(ctx, "cap-1", "call-1", m)
	cancel() // the request that carried the links is over; the downloads go on
	e.saver.Wait()

	rec := e.byURL(t, m.RecordingURL)
	sum := sha256.Sum256(mediaRecording)
	if rec.Status != agentdb.MediaSaved || rec.Size != int64(len(mediaRecording)) || rec.ContentType != "audio/ogg" ||
		rec.SHA256 != hex.EncodeToString(sum[:]) || rec.Attempts != 1 || rec.CallID != "call-1" || rec.CaptureID != "cap-1" ||
		rec.Kind != agentdb.MediaRecording || !strings.HasSuffix(rec.File, ".ogg") || rec.ExpiresAt.IsZero() {
		t.Errorf("recording: %+v", rec)
	}
	if b, err := os.ReadFile(filepath.Join(e.dir, rec.File)); err != nil || string(b) != string(mediaRecording) {
		t.Errorf("file: %q %v", b, err)
	}
	tr := e.byURL(t, m.TranscriptURL)
	if tr.Status != agentdb.MediaSaved || tr.Kind != agentdb.MediaTranscript || !strings.HasSuffix(tr.File, ".json") {
		t.Errorf("transcript: %+v", tr)
	}
	if s := e.byURL(t, slow.RecordingURL); s.Status != agentdb.MediaSaved {
		t.Errorf("slow: %+v", s)
	}
	e.mu.Lock()
	if len(e.seen) < 6 {
		t.Errorf("OnUpdate called %d times", len(e.seen))
	}
	e.mu.Unlock()

	// A duplicate delivery carries the same links: nothing is fetched again.
	e.saver.Save(context.Background(), "cap-2", "call-1", m)
	e.saver.Wait()
	if n := e.cdn.count("/calls/rec.ogg"); n != 1 {
		t.Errorf("recording fetched %d times", n)
	}
	if files := e.files(t, agentdb.MediaFilter{CallID: "call-1"}); len(files) != 2 {
		t.Errorf("%d records for call-1", len(files))
	}
	// No stray temporary files.
	entries, _ := os.ReadDir(e.dir)
	for _, de := range entries {
		if strings.HasPrefix(de.Name(), ".") {
			t.Errorf("left over: %s", de.Name())
		}
	}
}

func TestMediaRetriesAndFailures(t *testing.T) {
	e := newMediaEnv(t, true)
	flaky := e.cdnURL + "/flaky.ogg"
	expired := e.cdnURL + "/expired.ogg"
	big := e.cdnURL + "/big.bin"
	e.saver.Save(context.Background(), "c", "call-2", callevent.Media{RecordingURL: flaky, TranscriptURL: expired})
	e.saver.Save(context.Background(), "c", "call-3", callevent.Media{RecordingURL: big, TranscriptURL: "file:///etc/passwd"})
	e.saver.Wait()

	if f := e.byURL(t, flaky); f.Status != agentdb.MediaSaved || f.Attempts != 3 || f.Error != "" {
		t.Errorf("flaky: %+v", f)
	}
	if f := e.byURL(t, expired); f.Status != agentdb.MediaFailed || f.Attempts != 1 || !strings.Contains(f.Error, "403") || !strings.Contains(f.Error, "expired") {
		t.Errorf("expired: %+v", f)
	}
	if f := e.byURL(t, big); f.Status != agentdb.MediaFailed || !strings.Contains(f.Error, "larger than") {
		t.Errorf("big: %+v", f)
	}
	if f := e.byURL(t, "file:///etc/passwd"); f.Status != agentdb.MediaFailed || f.Attempts != 0 {
		t.Errorf("file URL: %+v", f)
	}

	// A failed link is tried again when it comes again.
	e.saver.Save(context.Background(), "c2", "call-2", callevent.Media{TranscriptURL: expired})
	e.saver.Wait()
	if n := e.cdn.count("/expired.ogg"); n != 2 {
		t.Errorf("expired fetched %d times", n)
	}
}

func TestMediaRefusesPrivateAddresses(t *testing.T) {
	e := newMediaEnv(t, false)
	u := e.cdnURL + "/calls/rec.ogg"
	e.saver.Save(context.Background(), "c", "call-4", callevent.Media{RecordingURL: u})
	e.saver.Wait()
	if f := e.byURL(t, u); f.Status != agentdb.MediaFailed || f.Attempts != 1 || !strings.Contains(f.Error, "private") {
		t.Errorf("%+v", f)
	}
	if n := e.cdn.count("/calls/rec.ogg"); n != 0 {
		t.Errorf("loopback reached %d times", n)
	}
}

func TestMediaSaveCapture(t *testing.T) {
	e := newMediaEnv(t, true)
	ps := callevent.CallSpec{MediaBaseURL: e.cdnURL + "/x"}.Events()
	p := ps[4]
	p.Media.RecordingURL = e.cdnURL + "/calls/rec.ogg"
	caps := callsCapture(t, e.db, time.Now(), ps[0], p)
	dup := callsCaptureBody(time.Now(), caps[1].Body)
	dup.DuplicateOf = caps[1].ID
	for _, c := range append(caps, dup) {
		e.saver.SaveCapture(c)
	}
	e.saver.Wait()
	files := e.files(t, agentdb.MediaFilter{CaptureID: caps[1].ID})
	if len(files) != 2 {
		t.Fatalf("%d files for the analysis capture", len(files))
	}
	if f := e.byURL(t, p.Media.RecordingURL); f.Status != agentdb.MediaSaved || f.CallID != p.Call.CallID {
		t.Errorf("%+v", f)
	}
	if files := e.files(t, agentdb.MediaFilter{CaptureID: dup.ID}); len(files) != 0 {
		t.Errorf("duplicate capture downloaded again: %+v", files)
	}
}

func TestMediaRoutes(t *testing.T) {
	e := newMediaEnv(t, true)
	ps := callevent.CallSpec{}.Events()
	callID := ps[0].Call.CallID
	callsCapture(t, e.db, time.Now(), ps...)
	rec, html := e.cdnURL+"/calls/rec.ogg", e.cdnURL+"/page.html"
	e.saver.Save(context.Background(), "c", callID, callevent.Media{RecordingURL: rec, TranscriptURL: html})
	e.saver.Wait()
	recID, htmlID := e.byURL(t, rec).ID, e.byURL(t, html).ID

	var page struct {
		Count   int                       `json:"count"`
		Results []inspector.MediaFileJSON `json:"results"`
	}
	if st, env := callsGet(t, e.api+"/api/v1/ext/media/?call_id="+callID, &page); st != 200 || page.Count != 2 {
		t.Fatalf("list: %d %+v %+v", st, env, page)
	}
	for _, f := range page.Results {
		if f.Status != "saved" || f.URL == nil || *f.URL != "/api/v1/ext/media/"+f.ID || f.Size == nil || f.SHA256 == "" {
			t.Errorf("listed: %+v", f)
		}
	}
	var one inspector.MediaFileJSON
	if st, _ := callsGet(t, e.api+"/api/v1/ext/media/"+recID+"/", &one); st != 200 || one.ID != recID || one.Kind != "recording" {
		t.Errorf("record: %d %+v", st, one)
	}
	var det inspector.CallDetail
	if st, _ := callsGet(t, e.api+"/api/v1/ext/calls/"+callID+"/", &det); st != 200 || len(det.MediaFiles) != 2 {
		t.Errorf("call detail media: %d %+v", st, det.MediaFiles)
	}

	// The file, with ranges for seeking in an audio player.
	req, _ := http.NewRequest("GET", e.api+"/api/v1/ext/media/"+recID, nil)
	req.Header.Set("Range", "bytes=0-3")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 206 || string(b) != "OggS" || resp.Header.Get("Content-Type") != "audio/ogg" ||
		!strings.HasPrefix(resp.Header.Get("Content-Disposition"), "inline") {
		t.Errorf("file: %d %q %v", resp.StatusCode, b, resp.Header)
	}
	// HTML never renders in the inspector's origin.
	resp, err = http.Get(e.api + "/api/v1/ext/media/" + htmlID)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Header.Get("Content-Type") != "application/octet-stream" || !strings.HasPrefix(resp.Header.Get("Content-Disposition"), "attachment") ||
		resp.Header.Get("X-Content-Type-Options") != "nosniff" || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "sandbox") {
		t.Errorf("html served as %v", resp.Header)
	}
	for _, u := range []string{"/api/v1/ext/media/nope", "/api/v1/ext/media/nope/"} {
		if st, env := callsGet(t, e.api+u, nil); st != 404 || env.Error == nil || env.Error.Code != "not_found" {
			t.Errorf("%s: %d %+v", u, st, env)
		}
	}
	if st, _ := callsGet(t, e.api+"/api/v1/ext/media/?limit=x", nil); st != 400 {
		t.Errorf("bad limit: %d", st)
	}
}

func TestRewriteMediaLinks(t *testing.T) {
	e := newMediaEnv(t, true)
	p := callevent.CallSpec{MediaBaseURL: e.cdnURL}.Events()[4]
	saved := e.cdnURL + "/calls/rec.ogg"
	e.saver.Save(context.Background(), "c", p.Call.CallID, callevent.Media{RecordingURL: saved})
	e.saver.Wait()
	recID := e.byURL(t, saved).ID

	// The payload's own link was never saved, but the call's recording
	// was: matched by call and kind. The transcript has no copy: kept.
	body, _ := json.Marshal(p)
	out, n, err := mediasave.RewriteLinks(context.Background(), e.db, body, "http://127.0.0.1:4040/")
	if err != nil || n != 1 {
		t.Fatalf("%d %v", n, err)
	}
	var back callevent.Payload
	json.Unmarshal(out, &back)
	if back.Media.RecordingURL != "http://127.0.0.1:4040/api/v1/ext/media/"+recID || back.Media.TranscriptURL != p.Media.TranscriptURL {
		t.Errorf("media: %+v", back.Media)
	}
	// Exact link match, in another call's payload.
	other := callevent.CallSpec{}.Events()[4]
	other.Media.RecordingURL = saved
	body, _ = json.Marshal(other)
	if out, n, err = mediasave.RewriteLinks(context.Background(), e.db, body, "http://x"); err != nil || n != 1 || !strings.Contains(string(out), "http://x/api/v1/ext/media/"+recID) {
		t.Errorf("%d %v %s", n, err, out)
	}
	// Nothing to rewrite.
	body = []byte(`{"event":"call.started"}`)
	if out, n, err = mediasave.RewriteLinks(context.Background(), e.db, body, "http://x"); n != 0 || err != nil || string(out) != string(body) {
		t.Errorf("%d %v %s", n, err, out)
	}
}

func TestParseMediaLinks(t *testing.T) {
	for data, want := range map[string]callevent.Media{
		`{"recording_url":"https://cdn/r.ogg?sig=1","transcript_url":"https://cdn/t.json?sig=1","expires_in":600}`: {RecordingURL: "https://cdn/r.ogg?sig=1", TranscriptURL: "https://cdn/t.json?sig=1", ExpiresIn: 600},
		`{"url":"https://cdn/r2.ogg"}`:                              {RecordingURL: "https://cdn/r2.ogg"},
		`"https://cdn/r3.ogg"`:                                      {RecordingURL: "https://cdn/r3.ogg"},
		`{"media":{"recording_url":"https://cdn/r4.ogg"}}`:          {RecordingURL: "https://cdn/r4.ogg"},
		`{"download_url":"https://cdn/r5.ogg","expires_in":"soon"}`: {RecordingURL: "https://cdn/r5.ogg"},
		`{}`:   {},
		`null`: {},
		`[1]`:  {},
	} {
		if got := mediasave.ParseLinks(json.RawMessage(data)); got.RecordingURL != want.RecordingURL || got.TranscriptURL != want.TranscriptURL || got.ExpiresIn != want.ExpiresIn {
			t.Errorf("%s: %+v", data, got)
		}
	}
}
