package agent

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
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

// Recordings that outlive their links: the media links of call events are
// signed and short-lived, so the agent downloads them as soon as an event
// carries them, in the background, and the inspector serves the copies.

// MediaConfig configures a MediaSaver.
type MediaConfig struct {
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

// MediaSaver downloads media links in the background, on goroutines of its
// own that run until they are done or Close stops them.
type MediaSaver struct {
	cfg       MediaConfig
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

// NewMediaSaver makes a saver. It starts nothing until asked to save.
func NewMediaSaver(cfg MediaConfig) (*MediaSaver, error) {
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
	s := &MediaSaver{cfg: cfg, sem: make(chan struct{}, cfg.Concurrency), running: map[*task]struct{}{}}
	if cfg.Client == nil {
		s.cfg.Client = mediaClient(cfg.AllowPrivate)
		s.ownClient = true
	}
	return s, nil
}

// errPrivateAddress refuses a link to the developer's own network.
var errPrivateAddress = errors.New("link points at a loopback or private address (allowed only with the emulator)")

// mediaClient checks the address actually dialled, after DNS, so that a
// name that resolves to 127.0.0.1 is refused as surely as the literal.
func mediaClient(allowPrivate bool) *http.Client {
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	if !allowPrivate {
		d.Control = func(network, address string, _ syscall.RawConn) error {
			host, _, err := net.SplitHostPort(address)
			if err != nil {
				return err
			}
			ip := net.ParseIP(host)
			if ip == nil || ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
				ip.IsUnspecified() || ip.IsMulticast() {
				return errPrivateAddress
			}
			return nil
		}
	}
	return &http.Client{Transport: &http.Transport{
		DialContext:           d.DialContext,
		TLSHandshakeTimeout:   30 * time.Second,
		ResponseHeaderTimeout: time.Minute,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		ForceAttemptHTTP2:     true,
	}}
}

// Save downloads m's recording and transcript links at once, each in its
// own goroutine; it returns without waiting for anything, not even the
// database. A link already saved (a duplicate delivery) is not fetched
// again; one that failed before is tried again. The downloads run until
// they are done or Close stops them, not as long as ctx: they outlive the
// request that carried the links. After Close, Save starts nothing.
func (s *MediaSaver) Save(ctx context.Context, captureID, callID string, m callevent.Media) {
	s.save(captureID, callID, m, false)
}

// save is Save; within says it runs on one of the saver's goroutines.
func (s *MediaSaver) save(captureID, callID string, m callevent.Media, within bool) {
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
func (s *MediaSaver) start(within bool, f func(ctx context.Context)) {
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
func (s *MediaSaver) Wait() { s.wg.Wait() }

// Close stops the downloads, each recorded as stopped, and waits until they
// have ended or ctx has; the saver starts nothing afterwards.
func (s *MediaSaver) Close(ctx context.Context) error {
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
func (s *MediaSaver) SaveCapture(c *agentdb.Capture) {
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

func (s *MediaSaver) update(ctx context.Context, f *agentdb.MediaFile) {
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
func (s *MediaSaver) fetch(ctx context.Context, f *agentdb.MediaFile) {
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
func (s *MediaSaver) refuseLink(ctx context.Context, row *agentdb.MediaFile, log *slog.Logger) bool {
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
func (s *MediaSaver) downloadWithRetries(ctx context.Context, row *agentdb.MediaFile, log *slog.Logger) {
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
func (s *MediaSaver) attempt(ctx context.Context, row *agentdb.MediaFile, n int) (ok, retry bool, err error) {
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

// pause waits for d, or less if ctx ends first; it reports whether it
// waited the whole d.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		t.Stop()
		return false
	}
}

// isSampleHost reports whether host is a name reserved for examples and
// documentation (RFC 2606, RFC 6761): example.com, .net and .org and their
// subdomains, and the .example, .invalid and .test domains. No real media
// is served there; sample call events link to them.
func isSampleHost(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	for _, d := range []string{"example.com", "example.net", "example.org", "example", "invalid", "test"} {
		if host == d || strings.HasSuffix(host, "."+d) {
			return true
		}
	}
	return false
}

// download makes one attempt and, on success, fills in the file fields.
func (s *MediaSaver) download(ctx context.Context, f *agentdb.MediaFile) (retry bool, err error) {
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
		return true, mediaError(err)
	}
	defer resp.Body.Close()
	if retry, err := statusError(resp.StatusCode, f.CallID); err != nil {
		return retry, err
	}
	return s.store(f, resp)
}

// statusError is the error of an answer's status, nil for 2xx, and whether
// it is worth another try: the voice service's own retry rule.
func statusError(st int, callID string) (retry bool, err error) {
	switch {
	case st >= 200 && st < 300:
		return false, nil
	case callevent.Retryable(st):
		return true, fmt.Errorf("HTTP %d", st)
	case st == http.StatusForbidden || st == http.StatusUnauthorized || st == http.StatusGone:
		return false, fmt.Errorf("HTTP %d: the signed link may have expired; `calltap media %s` asks the service for fresh links", st, callID)
	default:
		return false, fmt.Errorf("HTTP %d", st)
	}
}

// store writes resp's body, at most MaxBytes, to a temporary file in Dir
// and renames it into place as f's file, so that a file under its final
// name is always whole; then it fills in f's file fields.
func (s *MediaSaver) store(f *agentdb.MediaFile, resp *http.Response) (retry bool, err error) {
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
		return true, fmt.Errorf("reading the file: %w", mediaError(err))
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
	name := f.ID + mediaExt(f.SourceURL, ctype)
	if err := os.Rename(tmp.Name(), filepath.Join(s.cfg.Dir, name)); err != nil {
		return false, err
	}
	tmp = nil
	f.File, f.Size, f.ContentType, f.SHA256 = name, n, ctype, hex.EncodeToString(h.Sum(nil))
	return false, nil
}

// mediaError drops the URL from net/http's errors: signed links are
// credentials of a sort, and the record already holds the URL.
func mediaError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

var mediaExtRE = regexp.MustCompile(`^\.[a-z0-9]{1,5}$`)

// mediaExt picks a harmless file extension from the link's path or the
// content type.
func mediaExt(link, ctype string) string {
	if u, err := url.Parse(link); err == nil {
		if ext := strings.ToLower(path.Ext(u.Path)); mediaExtRE.MatchString(ext) {
			return ext
		}
	}
	mt, _, _ := mime.ParseMediaType(ctype)
	switch mt {
	case "audio/mpeg":
		return ".mp3"
	case "audio/wav", "audio/x-wav", "audio/wave":
		return ".wav"
	case "audio/ogg", "audio/opus":
		return ".ogg"
	case "audio/mp4":
		return ".m4a"
	case "application/json":
		return ".json"
	case "text/plain":
		return ".txt"
	}
	return ".bin"
}

// MediaPath is where the inspector serves a saved file.
func MediaPath(id string) string { return "/api/v1/ext/media/" + url.PathEscape(id) }

// RewriteMediaLinks points the media links of a payload at the saved
// copies, served by the inspector at inspectorURL (such as
// "http://127.0.0.1:4040"), for replays made after the signed originals
// expired (--rewrite-media). A link is matched by its URL, else by the
// call and kind of a saved file. Links without a saved copy are left as
// they are; n says how many were rewritten. Other bytes are unchanged.
func RewriteMediaLinks(ctx context.Context, db *agentdb.AgentStore, body []byte, inspectorURL string) (out []byte, n int, err error) {
	ix, _ := callevent.Index(body)
	base := strings.TrimRight(inspectorURL, "/")
	out, n = callevent.RewriteMediaURLs(body, func(field, link string) (string, bool) {
		if err != nil {
			return "", false
		}
		kind := agentdb.MediaRecording
		if field == callevent.FieldTranscriptURL {
			kind = agentdb.MediaTranscript
		}
		files, _, ferr := db.MediaFiles(ctx, agentdb.MediaFilter{SourceURL: link, Kind: kind, Status: agentdb.MediaSaved, Page: storage.Page{Limit: 1}})
		if ferr == nil && len(files) == 0 && ix.CallID != "" {
			files, _, ferr = db.MediaFiles(ctx, agentdb.MediaFilter{CallID: ix.CallID, Kind: kind, Status: agentdb.MediaSaved, Page: storage.Page{Limit: 1}})
		}
		if ferr != nil {
			err = ferr
			return "", false
		}
		if len(files) == 0 {
			return "", false
		}
		return base + MediaPath(files[0].ID), true
	})
	if err != nil {
		return body, 0, err
	}
	return out, n, nil
}

// ParseMediaLinks reads the links of a call's files from the data of the
// service's GET /call_logs/{id}/media/ (documentation section 4.4). Its
// shape is "not shown", so the links are looked for leniently:
// recording_url and transcript_url (also inside a media object), or a
// single url, link or download_url taken as the recording, or data being
// the URL itself.
func ParseMediaLinks(data json.RawMessage) callevent.Media { return mediaFromData(data) }

func mediaFromData(data json.RawMessage) callevent.Media {
	var s string
	if json.Unmarshal(data, &s) == nil {
		return callevent.Media{RecordingURL: s}
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(data, &obj) != nil {
		return callevent.Media{}
	}
	if inner, ok := obj["media"]; ok {
		if m := mediaFromData(inner); m.RecordingURL != "" || m.TranscriptURL != "" {
			return m
		}
	}
	str := func(keys ...string) string {
		for _, k := range keys {
			var v string
			if json.Unmarshal(obj[k], &v) == nil && v != "" {
				return v
			}
		}
		return ""
	}
	m := callevent.Media{
		RecordingURL:  str("recording_url", "url", "link", "download_url", "signed_url", "recording"),
		TranscriptURL: str("transcript_url", "transcript"),
	}
	json.Unmarshal(obj["expires_in"], &m.ExpiresIn)
	return m
}
