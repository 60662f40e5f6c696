package mediasave

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/storage/agentdb"
)

// A saver given no backoff waits 2 s, 10 s and 30 s before its retries, as
// Config says; one given an empty list tries each link once: a busy
// link fails at its first attempt.
func TestMediaSaverBackoff(t *testing.T) {
	db := openStore(t)
	s, err := New(Config{DB: db, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if want := []time.Duration{2 * time.Second, 10 * time.Second, 30 * time.Second}; !slices.Equal(s.cfg.Backoff, want) {
		t.Errorf("default backoff %v, want %v", s.cfg.Backoff, want)
	}
	s.Close(context.Background())

	hs := mediaHost(t)
	once := newSaver(t, Config{DB: db, Dir: t.TempDir(), AllowPrivate: true, Backoff: []time.Duration{}, Logger: quiet})
	c := writeCapture(t, db, testCapture(`{}`))
	once.Save(context.Background(), c.ID, "call-1", callevent.Media{RecordingURL: hs.URL + "/busy"})
	once.Wait()
	if f := mediaOf(t, db, c.ID)[agentdb.MediaRecording]; f == nil || f.Status != agentdb.MediaFailed || f.Attempts != 1 {
		t.Errorf("a busy link with no retries: %+v, want failed after one attempt", f)
	}
}

// A link the event says expires in n seconds is recorded expiring n
// seconds after it came; one without says nothing of its expiry.
func TestMediaSaverExpiry(t *testing.T) {
	hs := mediaHost(t)
	db := openStore(t)
	s := newSaver(t, Config{DB: db, Dir: t.TempDir(), AllowPrivate: true, Logger: quiet})
	caps := []*agentdb.Capture{testCapture(`{}`), testCapture(`{}`)}
	if _, err := db.WriteCaptures(context.Background(), caps, nil); err != nil {
		t.Fatal(err)
	}
	s.Save(context.Background(), caps[0].ID, "call-1", callevent.Media{RecordingURL: hs.URL + "/rec", ExpiresIn: 60})
	s.Save(context.Background(), caps[1].ID, "call-1", callevent.Media{RecordingURL: hs.URL + "/t.txt"})
	s.Wait()
	f := mediaOf(t, db, caps[0].ID)[agentdb.MediaRecording]
	if f == nil {
		t.Fatal("no media recorded for the link expiring in 60 s")
	}
	if left := f.ExpiresAt.Sub(f.CreatedAt); left < 59*time.Second || left > 61*time.Second {
		t.Errorf("a link expiring in 60 s: expires %s after it came (%s, %s)", left, f.CreatedAt, f.ExpiresAt)
	}
	if f := mediaOf(t, db, caps[1].ID)[agentdb.MediaRecording]; f == nil || !f.ExpiresAt.IsZero() {
		t.Errorf("a link without expiry: %+v, want no expiry", f)
	}
}

// With private addresses forbidden, the media client refuses a loopback
// address before connecting, and dials any other: the broadcast address,
// which no platform connects to, fails with the network's error, not the
// refusal.
func TestMediaClientRefusesOnlyPrivateAddresses(t *testing.T) {
	client := newClient(false)
	defer client.CloseIdleConnections()
	get := func(url string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // bounds a platform that waits
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := get("http://127.0.0.1:9/x"); !errors.Is(err, errPrivateAddress) {
		t.Errorf("loopback: %v, want it refused", err)
	}
	if err := get("http://255.255.255.255:9/x"); err == nil || errors.Is(err, errPrivateAddress) {
		t.Errorf("a public address: %v, want a network error, not the refusal", err)
	}
}

// A file of exactly MaxBytes is saved, and a download that went well logs
// no warning.
func TestMediaSaverFileAtTheLimit(t *testing.T) {
	hs := mediaHost(t)
	db := openStore(t)
	logged := &warnings{}
	s := newSaver(t, Config{DB: db, Dir: t.TempDir(), AllowPrivate: true, MaxBytes: int64(len("mp3 bytes")),
		Logger: slog.New(logged)})
	c := writeCapture(t, db, testCapture(`{}`))
	s.Save(context.Background(), c.ID, "call-1", callevent.Media{RecordingURL: hs.URL + "/rec"})
	s.Wait()
	if f := mediaOf(t, db, c.ID)[agentdb.MediaRecording]; f == nil || f.Status != agentdb.MediaSaved || f.Size != 9 {
		t.Errorf("a 9-byte file with a 9-byte limit: %+v, want saved", f)
	}
	if out := logged.logged(); len(out) != 0 {
		t.Errorf("logged: %q", out)
	}
}

// A replay's media links are pointed at the saved copy of their own kind:
// by the link itself, or, for a link the service signed anew, by the
// event's call; a link of a call with nothing saved is left as it is.
func TestRewriteMediaLinksByKindAndCall(t *testing.T) {
	hs := mediaHost(t)
	db := openStore(t)
	s := newSaver(t, Config{DB: db, Dir: t.TempDir(), AllowPrivate: true, Logger: quiet})
	c := writeCapture(t, db, testCapture(`{}`))
	s.Save(context.Background(), c.ID, "call-1", callevent.Media{RecordingURL: hs.URL + "/rec", TranscriptURL: hs.URL + "/t.txt"})
	s.Wait()
	saved := mediaOf(t, db, c.ID)
	rec, tr := saved[agentdb.MediaRecording], saved[agentdb.MediaTranscript]
	if rec == nil || tr == nil || rec.Status != agentdb.MediaSaved || tr.Status != agentdb.MediaSaved {
		t.Fatalf("media of the call: %v", saved)
	}
	const base = "http://127.0.0.1:4040"
	for _, tc := range []struct {
		name, call, rec, tr string
		n                   int
		wantRec, wantTr     string
	}{
		{"the saved links", "call-1", hs.URL + "/rec", hs.URL + "/t.txt", 2, base + URLPath(rec.ID), base + URLPath(tr.ID)},
		{"links signed anew", "call-1", "https://cdn.voice.io/r?sig=2", "https://cdn.voice.io/t?sig=2", 2, base + URLPath(rec.ID), base + URLPath(tr.ID)},
		{"another call's", "call-2", "https://cdn.voice.io/r?sig=3", "https://cdn.voice.io/t?sig=3", 0, "https://cdn.voice.io/r?sig=3", "https://cdn.voice.io/t?sig=3"},
	} {
		body := []byte(`{"event":"call.analysis_completed","call":{"call_id":"` + tc.call + `"},"media":{"recording_url":"` + tc.rec + `","transcript_url":"` + tc.tr + `"}}`)
		out, n, err := RewriteLinks(context.Background(), db, body, base+"/")
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var p struct {
			Media struct {
				RecordingURL  string `json:"recording_url"`
				TranscriptURL string `json:"transcript_url"`
			} `json:"media"`
		}
		if err := json.Unmarshal(out, &p); err != nil {
			t.Fatalf("%s: %v: %s", tc.name, err, out)
		}
		if n != tc.n || p.Media.RecordingURL != tc.wantRec || p.Media.TranscriptURL != tc.wantTr {
			t.Errorf("%s: %d rewritten, recording %s, transcript %s; want %d, %s, %s", tc.name, n, p.Media.RecordingURL, p.Media.TranscriptURL, tc.n, tc.wantRec, tc.wantTr)
		}
	}
}
