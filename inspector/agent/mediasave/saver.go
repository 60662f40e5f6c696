// Package mediasave saves the recordings and transcripts that call events
// link to, before their links expire: the links are signed and
// short-lived, so the agent has a Saver download them as soon as an event
// carries them, in the background, and the inspector serves the copies
// (at URLPath) and replays can point at them (RewriteLinks). Each file's
// record lives in the agent's store (storage/agentdb's media table).
//
// The client a Saver makes refuses links to loopback, private and
// link-local addresses, checked on the address dialled, unless the
// configuration allows them (for the emulator and tests).
//
// SaveCapture runs on the agent's capture path: it takes Saver.mu, and
// no other lock, only briefly, and returns at once.
package mediasave

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/storage/agentdb"
)

// Config configures a Saver.
type Config struct {
	DB  *agentdb.AgentStore
	Dir string // where files are written; created (0700) if missing

	// AllowPrivate lets links point at loopback, private and link-local
	// addresses. Off, a payload from anyone on the internet cannot make
	// the agent send requests into the developer's machine or network;
	// turn it on for the emulator and tests, whose links are on loopback.
	AllowPrivate bool
	Client       *http.Client // default: a client that enforces AllowPrivate when connecting

	MaxBytes       int64           // per file; default 1 GiB
	Backoff        []time.Duration // delay before each retry; default 2 s, 10 s, 30 s (so 4 attempts)
	AttemptTimeout time.Duration   // per attempt; default 10 min
	Concurrency    int             // downloads at once; default 4

	Logger *slog.Logger
	// OnUpdate, when set, is called after every change of a file's record
	// (to publish it on the live stream). It must not block.
	OnUpdate func(*agentdb.MediaFile)
}

// Saver downloads media links in the background, on goroutines of its
// own that run until they are done or Close stops them.
type Saver struct {
	cfg       Config
	ownClient bool          // cfg.Client is the saver's: Close closes its idle connections
	sem       chan struct{} // one token per running download

	mu      sync.Mutex
	closed  bool               // guarded by mu: Close was called
	running map[*task]struct{} // guarded by mu: started by start, not yet ended
	wg      sync.WaitGroup     // the running tasks; Add guarded by mu
}

// task is one goroutine of the saver's: a download, or the parse of a
// captured event's links.
type task struct{ cancel context.CancelFunc }

// New makes a saver. It starts nothing until asked to save.
func New(cfg Config) (*Saver, error) {
	if cfg.DB == nil || cfg.Dir == "" {
		return nil, errors.New("media: DB and Dir are required")
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("media: %w", err)
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = 1 << 30
	}
	if cfg.Backoff == nil {
		cfg.Backoff = []time.Duration{2 * time.Second, 10 * time.Second, 30 * time.Second}
	}
	if cfg.AttemptTimeout <= 0 {
		cfg.AttemptTimeout = 10 * time.Minute
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Saver{cfg: cfg, sem: make(chan struct{}, cfg.Concurrency), running: map[*task]struct{}{}}
	if cfg.Client == nil {
		s.cfg.Client = newClient(cfg.AllowPrivate)
		s.ownClient = true
	}
	return s, nil
}

// Save downloads m's recording and transcript links at once, each in its
// own goroutine; it returns without waiting for anything, not even the
// database. A link already saved (a duplicate delivery) is not fetched
// again; one that failed before is tried again. The downloads run until
// they are done or Close stops them, not as long as ctx: they outlive the
// request that carried the links. After Close, Save starts nothing.
func (s *Saver) Save(ctx context.Context, captureID, callID string, m callevent.Media) {
	s.save(captureID, callID, m, false)
}

// save is Save; within says it runs on one of the saver's goroutines.
func (s *Saver) save(captureID, callID string, m callevent.Media, within bool) {
	received := time.Now()
	var expires time.Time
	if m.ExpiresIn > 0 {
		expires = received.Add(time.Duration(m.ExpiresIn) * time.Second)
	}
	for _, l := range []struct{ kind, url string }{
		{agentdb.MediaRecording, m.RecordingURL},
		{agentdb.MediaTranscript, m.TranscriptURL},
	} {
		if l.url == "" {
			continue
		}
		f := &agentdb.MediaFile{ID: uuid.NewString(), CaptureID: captureID, CallID: callID, Kind: l.kind, SourceURL: l.url,
			ExpiresAt: expires, CreatedAt: received.UTC()}
		s.start(within, func(ctx context.Context) { s.fetch(ctx, f) })
	}
}

// start runs f on a goroutine of its own, with a context that Close
// cancels. After Close it does nothing, unless called within one of the
// saver's goroutines (which Close is waiting for): f then runs cancelled.
func (s *Saver) start(within bool, f func(ctx context.Context)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed && !within {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	if s.closed {
		cancel()
	}
	t := &task{cancel: cancel}
	s.running[t] = struct{}{}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f(ctx)
		s.mu.Lock()
		delete(s.running, t)
		s.mu.Unlock()
		cancel()
	}()
}

// Wait blocks until every download started so far has finished or given
// up. It is not called while Save or SaveCapture is. The saver's idle
// connections stay open for the next downloads: Close closes them.
func (s *Saver) Wait() { s.wg.Wait() }

// Close stops the downloads, each recorded as stopped, and waits until they
// have ended or ctx has; the saver starts nothing afterwards.
func (s *Saver) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	for t := range s.running {
		t.cancel()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { // ends with the downloads, whether or not Close still waits
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if s.ownClient {
		s.cfg.Client.CloseIdleConnections() // and their goroutines
	}
	return nil
}

// SaveCapture looks for media links in a captured call event and saves
// them, as Save does. It is meant for the capture path: it returns at
// once, and parses the body only for the kinds that carry media and only
// for the first copy of a delivery.
func (s *Saver) SaveCapture(c *agentdb.Capture) {
	if c.DuplicateOf != "" || (c.Event != callevent.KindRecordingAvailable && c.Event != callevent.KindAnalysisCompleted) {
		return
	}
	// A copy: the capture's body may be a buffer the relay connection
	// reuses once the request is forwarded.
	body, id := bytes.Clone(c.Body), c.ID
	s.start(false, func(context.Context) {
		var p callevent.Payload
		if json.Unmarshal(body, &p) != nil || p.Media == nil {
			return
		}
		callID := ""
		if p.Call != nil {
			callID = p.Call.CallID
		}
		s.save(id, callID, *p.Media, true)
	})
}

func (s *Saver) update(ctx context.Context, f *agentdb.MediaFile) {
	f.UpdatedAt = time.Now().UTC()
	// The downloads' context may be done (shutdown): record the outcome anyway.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := s.cfg.DB.UpdateMedia(ctx, f); err != nil {
		s.cfg.Logger.Warn("media: record download", "id", f.ID, "err", err)
	}
	if s.cfg.OnUpdate != nil {
		s.cfg.OnUpdate(f)
	}
}

// fetch claims the link and downloads it, retrying on the failures the
// voice service itself retries on: network errors, time-outs, 408, 429
// and 5xx. Any other answer (403 for an expired signature, 404) is final.
func (s *Saver) fetch(ctx context.Context, f *agentdb.MediaFile) {
	log := s.cfg.Logger.With("call_id", f.CallID, "kind", f.Kind)
	row, start, err := s.cfg.DB.ClaimMedia(ctx, f)
	if err != nil {
		log.Warn("media: record link", "err", err)
		return
	}
	if !start {
		return
	}
	if s.cfg.OnUpdate != nil {
		s.cfg.OnUpdate(row)
	}
	if s.refuseLink(ctx, row, log) {
		return
	}
	s.downloadWithRetries(ctx, row, log)
}

// refuseLink fails row without a try when its link is not one to
// download: not an http(s) URL, or a sample host. It reports whether it
// did.
func (s *Saver) refuseLink(ctx context.Context, row *agentdb.MediaFile, log *slog.Logger) bool {
	u, err := url.Parse(row.SourceURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		row.Status, row.Error = agentdb.MediaFailed, "not an http(s) URL"
		s.update(ctx, row)
		return true
	}
	if !isSampleHost(u.Hostname()) {
		return false
	}
	// calltap trigger's links by default: there is nothing to fetch,
	// and failing to resolve the name is no news worth a warning.
	row.Status, row.Error = agentdb.MediaFailed, "a sample link: "+u.Hostname()+" is reserved for examples and serves nothing (calltap trigger --media-base-url links files that exist)"
	s.update(ctx, row)
	log.Debug("media: sample link not downloaded", "host", u.Hostname())
	return true
}

// downloadWithRetries tries row's link until it is saved, fails for good,
// the tries (1 + len(Backoff)) run out or ctx ends, recording each
// outcome.
func (s *Saver) downloadWithRetries(ctx context.Context, row *agentdb.MediaFile, log *slog.Logger) {
	for attempt := 1; ; attempt++ {
		ok, retry, err := s.attempt(ctx, row, attempt)
		if !ok {
			row.Status, row.Error = agentdb.MediaFailed, "calltap stopped before the download finished"
			s.update(ctx, row)
			return
		}
		if err == nil {
			row.Status, row.Error, row.SavedAt = agentdb.MediaSaved, "", time.Now().UTC()
			s.update(ctx, row)
			log.Info("media: saved", "file", row.File, "size", row.Size)
			return
		}
		row.Error = err.Error()
		if !retry || attempt > len(s.cfg.Backoff) {
			row.Status = agentdb.MediaFailed
			s.update(ctx, row)
			log.Warn("media: download failed", "attempts", attempt, "err", err)
			return
		}
		s.update(ctx, row)
		if !pause(ctx, s.cfg.Backoff[attempt-1]) {
			row.Status = agentdb.MediaFailed
			row.Error += " (calltap stopped before the next attempt)"
			s.update(ctx, row)
			return
		}
	}
}

// attempt makes download attempt number n of row, holding a slot of s.sem
// so that at most that many downloads run at once. ok is false when ctx
// ended before a slot was free.
func (s *Saver) attempt(ctx context.Context, row *agentdb.MediaFile, n int) (ok, retry bool, err error) {
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return false, false, nil
	}
	defer func() { <-s.sem }()
	row.Attempts = n
	retry, err = s.download(ctx, row)
	return true, retry, err
}

// download makes one attempt and, on success, fills in the file fields.
func (s *Saver) download(ctx context.Context, f *agentdb.MediaFile) (retry bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.AttemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.SourceURL, nil)
	if err != nil {
		return false, err
	}
	req.Header.Set("User-Agent", "calltap-media")
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		if errors.Is(err, errPrivateAddress) {
			return false, errPrivateAddress
		}
		return true, withoutURL(err)
	}
	defer resp.Body.Close()
	if retry, err := statusError(resp.StatusCode, f.CallID); err != nil {
		return retry, err
	}
	return s.store(f, resp)
}

// store writes resp's body, at most MaxBytes, to a temporary file in Dir
// and renames it into place as f's file, so that a file under its final
// name is always whole; then it fills in f's file fields.
func (s *Saver) store(f *agentdb.MediaFile, resp *http.Response) (retry bool, err error) {
	tmp, err := os.CreateTemp(s.cfg.Dir, ".download-*")
	if err != nil {
		return false, err
	}
	defer func() {
		if tmp != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(resp.Body, s.cfg.MaxBytes+1))
	if err != nil {
		return true, fmt.Errorf("reading the file: %w", withoutURL(err))
	}
	if n > s.cfg.MaxBytes {
		return false, fmt.Errorf("larger than %d bytes", s.cfg.MaxBytes)
	}
	if err := tmp.Close(); err != nil {
		return false, err
	}
	ctype := resp.Header.Get("Content-Type")
	if _, _, err := mime.ParseMediaType(ctype); err != nil {
		ctype = "application/octet-stream"
	}
	name := f.ID + fileExt(f.SourceURL, ctype)
	if err := os.Rename(tmp.Name(), filepath.Join(s.cfg.Dir, name)); err != nil {
		return false, err
	}
	tmp = nil
	f.File, f.Size, f.ContentType, f.SHA256 = name, n, ctype, hex.EncodeToString(h.Sum(nil))
	return false, nil
}
