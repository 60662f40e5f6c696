package emulator

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/storage/servicedb"
)

// mediaPrefix is where the emulator serves the files its signed links name.
const mediaPrefix = "/media/calls/"

// The files of a call's media.
const (
	recordingFile  = "recording.wav"
	transcriptFile = "transcript.txt"
)

// MediaLinks is the data of GET /call_logs/{id}/media/, whose shape the
// documentation does not show: the media block of 6.6 with the call and
// the moment the links stop working.
type MediaLinks struct {
	CallID        string  `json:"call_id"`
	RecordingURL  string  `json:"recording_url"`
	TranscriptURL string  `json:"transcript_url"`
	ExpiresIn     int     `json:"expires_in"`
	ExpiresAt     *string `json:"expires_at"`
}

// signedMedia is a media block whose links, signed by the emulator, work
// until at + MediaExpiresIn.
func (s *Server) signedMedia(base, callID string, at time.Time) *callevent.Media {
	exp := at.Add(s.cfg.MediaExpiresIn).Unix()
	return &callevent.Media{
		RecordingURL:  s.signedLink(base, callID, recordingFile, exp),
		TranscriptURL: s.signedLink(base, callID, transcriptFile, exp),
		ExpiresIn:     int(s.cfg.MediaExpiresIn / time.Second),
	}
}

func (s *Server) signedLink(base, callID, file string, expires int64) string {
	q := url.Values{}
	q.Set("expires", strconv.FormatInt(expires, 10))
	q.Set("signature", s.sign(callID, file, expires))
	return base + mediaPrefix + url.PathEscape(callID) + "/" + file + "?" + q.Encode()
}

func (s *Server) sign(callID, file string, expires int64) string {
	m := hmac.New(sha256.New, s.secret)
	fmt.Fprintf(m, "%s\n%s\n%d", callID, file, expires)
	return hex.EncodeToString(m.Sum(nil))
}

// callMedia mints fresh links to a call's recording and transcript, once
// call.recording_available has been sent (or was due, when not subscribed).
func (s *Server) callMedia(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	call, err := s.db.CallByID(r.Context(), id)
	if errors.Is(err, servicedb.ErrNotFound) {
		api.WriteError(w, api.NotFound("call log "+id))
		return
	} else if err != nil {
		s.fail(w, r, err)
		return
	}
	now := s.now()
	if call.RecordingAt.IsZero() {
		api.WriteError(w, api.NotFound("recording of call "+id+" (the call never connected)"))
		return
	}
	if now.Before(call.RecordingAt) {
		api.WriteError(w, api.NotFound("recording of call "+id+" (not ready yet; wait for call.recording_available)"))
		return
	}
	m := s.signedMedia(s.baseURL(r), call.ID, now)
	api.WriteData(w, http.StatusOK, "", MediaLinks{CallID: call.ID, RecordingURL: m.RecordingURL, TranscriptURL: m.TranscriptURL,
		ExpiresIn: m.ExpiresIn, ExpiresAt: api.Time(now.Add(s.cfg.MediaExpiresIn).Truncate(time.Second))})
}

// mediaFile serves a file named by a signed link, until the link expires.
func (s *Server) mediaFile(w http.ResponseWriter, r *http.Request) {
	callID, file := r.PathValue("call"), r.PathValue("file")
	q := r.URL.Query()
	expires, err := strconv.ParseInt(q.Get("expires"), 10, 64)
	sig, _ := hex.DecodeString(q.Get("signature"))
	want, _ := hex.DecodeString(s.sign(callID, file, expires))
	if err != nil || !hmac.Equal(sig, want) {
		api.WriteError(w, api.Errorf(http.StatusForbidden, api.CodeForbidden, "the link's signature is not valid"))
		return
	}
	if s.now().Unix() >= expires {
		api.WriteError(w, api.Errorf(http.StatusForbidden, api.CodeForbidden, "the link expired at %s; get a fresh one from GET /call_logs/%s/media/",
			time.Unix(expires, 0).UTC().Format(time.RFC3339), callID))
		return
	}
	call, err := s.db.CallByID(r.Context(), callID)
	if errors.Is(err, servicedb.ErrNotFound) || err == nil && call.RecordingAt.IsZero() {
		api.WriteError(w, api.NotFound("media of call "+callID))
		return
	} else if err != nil {
		s.fail(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "private, no-store")
	switch file {
	case recordingFile:
		w.Header().Set("Content-Type", "audio/wav")
		http.ServeContent(w, r, file, call.RecordingAt, bytes.NewReader(s.wav))
	case transcriptFile:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		http.ServeContent(w, r, file, call.RecordingAt, strings.NewReader(transcript(call)))
	default:
		api.WriteError(w, api.NotFound("media file "+file))
	}
}

// transcript is the plain-text transcript of a completed call.
func transcript(c *servicedb.Call) string {
	agent, contact := c.AgentName, c.ContactName
	if agent == "" {
		agent = "Agent"
	}
	if strings.TrimSpace(contact) == "" {
		contact = "Contact"
	}
	first := strings.Fields(contact)[0]
	lines := []string{
		fmt.Sprintf("Transcript of call %s", c.ID),
		"",
		fmt.Sprintf("%s: Hi %s, this is %s calling about your trial. Do you have a minute?", agent, first, agent),
		fmt.Sprintf("%s: Sure, go ahead.", contact),
		fmt.Sprintf("%s: Are you interested in continuing after the trial?", agent),
		fmt.Sprintf("%s: Yes, I think so.", contact),
		fmt.Sprintf("%s: Great. When is a good time for a follow-up call?", agent),
		fmt.Sprintf("%s: Next Tuesday morning works.", contact),
		fmt.Sprintf("%s: Perfect, I'll put that in. Thanks, %s!", agent, first),
	}
	return strings.Join(lines, "\n") + "\n"
}

// sineWAV is the recording: 1.5 s of a 440 Hz tone, 8 kHz 16-bit mono PCM,
// fading in and out so it does not click.
func sineWAV() []byte {
	const (
		rate    = 8000
		seconds = 1.5
		freq    = 440.0
		fade    = 0.05 // seconds
	)
	n := int(rate * seconds)
	data := make([]byte, 2*n)
	for i := 0; i < n; i++ {
		t := float64(i) / rate
		amp := 0.3
		if t < fade {
			amp *= t / fade
		} else if rest := seconds - t; rest < fade {
			amp *= rest / fade
		}
		v := int16(amp * math.MaxInt16 * math.Sin(2*math.Pi*freq*t))
		binary.LittleEndian.PutUint16(data[2*i:], uint16(v))
	}
	var b bytes.Buffer
	w := func(v any) { binary.Write(&b, binary.LittleEndian, v) }
	b.WriteString("RIFF")
	w(uint32(36 + len(data)))
	b.WriteString("WAVEfmt ")
	w(uint32(16))       // fmt chunk size
	w(uint16(1))        // PCM
	w(uint16(1))        // mono
	w(uint32(rate))     // sample rate
	w(uint32(rate * 2)) // byte rate
	w(uint16(2))        // block align
	w(uint16(16))       // bits per sample
	b.WriteString("data")
	w(uint32(len(data)))
	b.Write(data)
	return b.Bytes()
}
