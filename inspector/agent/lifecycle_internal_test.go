package agent

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/storage/agentdb"
)

// logged keeps what an agent logs, for tests of what it tells its operator.
type logged struct {
	mu   sync.Mutex
	recs []loggedRecord // guarded by mu
}

type loggedRecord struct {
	level slog.Level
	msg   string
	count int64 // the "count" attribute; -1 when there is none
}

func (l *logged) Enabled(context.Context, slog.Level) bool { return true }
func (l *logged) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logged) WithGroup(string) slog.Handler            { return l }

func (l *logged) Handle(_ context.Context, r slog.Record) error {
	rec := loggedRecord{level: r.Level, msg: r.Message, count: -1}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "count" {
			rec.count = a.Value.Int64()
		}
		return true
	})
	l.mu.Lock()
	l.recs = append(l.recs, rec)
	l.mu.Unlock()
	return nil
}

// take returns the records at level Info and above logged since the last
// take.
func (l *logged) take() []loggedRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []loggedRecord
	for _, r := range l.recs {
		if r.level >= slog.LevelInfo {
			out = append(out, r)
		}
	}
	l.recs = nil
	return out
}

// expectLogged checks that got is exactly the records want (level and
// count, the message's start), in order.
func expectLogged(t *testing.T, what string, got []loggedRecord, want ...loggedRecord) {
	t.Helper()
	ok := len(got) == len(want)
	for i := 0; ok && i < len(want); i++ {
		ok = got[i].level == want[i].level && got[i].count == want[i].count &&
			len(got[i].msg) >= len(want[i].msg) && got[i].msg[:len(want[i].msg)] == want[i].msg
	}
	if !ok {
		t.Errorf("%s: logged %+v, want %+v", what, got, want)
	}
}

// New fills in what a Config leaves unset, and keeps what it sets.
func TestNewFillsInDefaults(t *testing.T) {
	d := openDisk(t)
	a, err := New(Config{Store: d.store})
	if err != nil {
		t.Fatal(err)
	}
	a.cm.answers.timer.Stop()
	cfg := a.Config()
	if cfg.ForwardTimeout != 30*time.Second || cfg.MaxBody != 10<<20 || cfg.Logger != slog.Default() ||
		cfg.AnalysisPendingAfter != callevent.DefaultAnalysisPendingAfter {
		t.Errorf("defaults: %+v", cfg)
	}
	if tr := a.client.Transport.(*http.Transport); tr.IdleConnTimeout != 90*time.Second || tr.Proxy != nil {
		t.Errorf("https client: idle timeout %s", tr.IdleConnTimeout)
	}

	set := Config{Store: d.store, ForwardTimeout: time.Second, MaxBody: 7, Logger: quiet, AnalysisPendingAfter: 3 * time.Second}
	a, err = New(set)
	if err != nil {
		t.Fatal(err)
	}
	a.cm.answers.timer.Stop()
	if cfg := a.Config(); cfg.ForwardTimeout != set.ForwardTimeout || cfg.MaxBody != set.MaxBody || cfg.Logger != quiet ||
		cfg.AnalysisPendingAfter != set.AnalysisPendingAfter {
		t.Errorf("set: %+v", cfg)
	}
}

// The answers a stopping agent could not commit go to the answer reserve,
// and it says how many; without a reserve it says they are lost. The next
// start records them and marks a request whose answer went unrecorded
// "answer unknown", saying so; a start with nothing to take up says
// nothing.
func TestResumeTellsWhatItTookUp(t *testing.T) {
	ctx := context.Background()
	d := openDisk(t)
	answered, interrupted := testCapture(`{"n":1}`), testCapture(`{"n":2}`)
	if _, err := d.store.LogCaptures(ctx, []*agentdb.Capture{answered, interrupted}, nil); err != nil {
		t.Fatal(err)
	}
	answer := *answered
	answer.Status, answer.Attempts, answer.ResponseStatus, answer.Duration = agentdb.StatusDelivered, 1, 200, time.Millisecond

	log := &logged{}
	a, err := New(Config{Store: d.store, Logger: slog.New(log)})
	if err != nil {
		t.Fatal(err)
	}
	a.cm.answers.timer.Stop()
	a.spillAnswers(nil)
	expectLogged(t, "no answers to spill", log.take())
	a.spillAnswers([]*agentdb.Capture{&answer}) // no reserve made yet
	expectLogged(t, "spilled with no reserve", log.take(), loggedRecord{level: slog.LevelError, msg: "answers lost", count: 1})
	if err := d.store.ReserveAnswers(); err != nil {
		t.Fatal(err)
	}
	a.spillAnswers([]*agentdb.Capture{&answer})
	expectLogged(t, "spilled", log.take(), loggedRecord{level: slog.LevelWarn, msg: "answers not recorded for want of room", count: 1})

	start := func() {
		t.Helper()
		a, err := New(Config{Store: d.store, ForwardTo: "http://127.0.0.1:1/", ResumeQueued: true, Logger: slog.New(log)})
		if err != nil {
			t.Fatal(err)
		}
		a.cm.answers.timer.Stop()
	}
	start()
	expectLogged(t, "resumed", log.take(),
		loggedRecord{level: slog.LevelInfo, msg: "answers an earlier run could not record", count: 1},
		loggedRecord{level: slog.LevelWarn, msg: "requests whose answer an earlier run did not record", count: 1})
	for id, want := range map[string]string{answered.ID: agentdb.StatusDelivered, interrupted.ID: agentdb.StatusUnknown} {
		if c, err := d.store.Capture(ctx, id); err != nil || c.Status != want {
			t.Errorf("capture after the resume: %+v (%v), want status %s", c, err, want)
		}
	}
	start()
	expectLogged(t, "resumed with nothing to take up", log.take())
}

// A capture committed is told to the inspector and, a call event linking
// media, to the media saver; one the relay sent again is neither; an agent
// without a media directory saves no media.
func TestCommittedInsertTellsTheMediaSaver(t *testing.T) {
	ctx := context.Background()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("mp3 bytes")) }))
	defer hs.Close()
	d := openDisk(t)
	mediaOf := func(id string) []*agentdb.MediaFile {
		files, _, err := d.store.MediaFiles(ctx, agentdb.MediaFilter{CaptureID: id})
		if err != nil {
			t.Fatal(err)
		}
		return files
	}
	recording := func() *agentdb.Capture {
		c := testCapture(`{"event":"` + callevent.KindRecordingAvailable + `","call":{"call_id":"call-3"},"media":{"recording_url":"` + hs.URL + `/rec"}}`)
		c.Event = callevent.KindRecordingAvailable
		if _, err := d.store.LogCaptures(ctx, []*agentdb.Capture{c}, nil); err != nil {
			t.Fatal(err)
		}
		return c
	}

	bare, err := New(Config{Store: d.store, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	bare.cm.answers.timer.Stop()
	c := recording()
	bare.committedInsert(c, agentdb.Written{Seq: 1, ID: c.ID})

	a, err := New(Config{Store: d.store, Logger: quiet, MediaDir: t.TempDir(), AllowPrivateMedia: true})
	if err != nil {
		t.Fatal(err)
	}
	a.cm.answers.timer.Stop()
	defer a.media.Close(ctx)
	again := recording()
	a.committedInsert(again, agentdb.Written{Seq: 2, ID: again.ID, Redelivered: true})
	saved := recording()
	a.committedInsert(saved, agentdb.Written{Seq: 3, ID: saved.ID})
	a.media.Wait()
	if f := mediaOf(saved.ID); len(f) != 1 || f[0].Kind != agentdb.MediaRecording || f[0].Status != agentdb.MediaSaved {
		t.Errorf("the recording of a committed capture: %+v", f)
	}
	if n := len(mediaOf(again.ID)) + len(mediaOf(c.ID)); n != 0 {
		t.Errorf("%d media saved for a capture sent again or with no media directory", n)
	}
}
