package e2e_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/calltap/calltap/cmd/stacktest"
	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/inspector/inspectortest"
	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/relay/polltest"
)

// A call's recording is saved through the tunnel as soon as its event
// arrives, served by the inspector, and a replay with --rewrite-media
// points at the copy once the signed link is gone.
func TestMediaSavedAndReplayRewritten(t *testing.T) {
	var expired atomic.Bool
	media := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if expired.Load() {
			http.Error(w, "signature expired", http.StatusForbidden)
			return
		}
		if strings.HasSuffix(r.URL.Path, "recording.ogg") {
			w.Header().Set("Content-Type", "audio/ogg")
			w.Write([]byte("OggS fake audio bytes"))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"transcript":"hello"}`))
	}))
	defer media.Close()
	h := &handler{}
	hs := httptest.NewServer(h)
	defer hs.Close()
	dir := t.TempDir()
	st := stacktest.Start(t, stacktest.Options{ForwardTo: hs.URL, Dir: dir, Agent: func(c *agent.Config) {
		c.MediaDir = filepath.Join(dir, "media")
		c.AllowPrivateMedia = true
		c.RewriteMedia = true
	}})
	spec := callevent.CallSpec{Flow: "completed", MediaBaseURL: media.URL, ExpiresIn: 3600}
	events := spec.Events()
	callID := events[0].Call.CallID
	var analysisBody string
	for _, ev := range events {
		b, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		send(t, st.TunnelURL, string(b))
		if ev.Event == callevent.KindAnalysisCompleted {
			analysisBody = string(b)
		}
	}
	var detail struct {
		Events     []json.RawMessage `json:"events"`
		MediaFiles []struct {
			Kind   string  `json:"kind"`
			Status string  `json:"status"`
			SHA256 string  `json:"sha256"`
			URL    *string `json:"url"`
		} `json:"media_files"`
	}
	polltest.Until(t, 10*time.Second, func() bool {
		_, env := inspectortest.Do(t, "GET", st.InspectorURL+"/api/v1/ext/calls/"+callID+"/", "")
		json.Unmarshal(env.Data, &detail)
		saved := 0
		for _, f := range detail.MediaFiles {
			if f.Status == "saved" {
				saved++
			}
		}
		return saved >= 2
	}, "the recording and transcript were not saved")
	if len(detail.Events) != 5 {
		t.Errorf("call has %d events", len(detail.Events))
	}
	var recording string
	for _, f := range detail.MediaFiles {
		if f.Kind == "recording" && f.URL != nil {
			recording = *f.URL
		}
	}
	resp, err := http.Get(st.InspectorURL + recording)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "OggS fake audio bytes" {
		t.Fatalf("saved recording served as %q", b)
	}

	// The links expire; a replay of analysis_completed points at the copies.
	expired.Store(true)
	_, env := inspectortest.Do(t, "GET", st.InspectorURL+"/api/v1/ext/webhooks/?event=call.analysis_completed", "")
	var p page
	json.Unmarshal(env.Data, &p)
	code, _ := inspectortest.Do(t, "POST", st.InspectorURL+"/api/v1/ext/webhooks/replay/", fmt.Sprintf(`{"id":%q}`, p.Results[0].ID))
	body, _ := h.last()
	if code != 200 || body == analysisBody || !strings.Contains(body, st.InspectorURL+"/api/v1/ext/media/") || strings.Contains(body, media.URL) {
		t.Fatalf("replayed body does not point at the saved copies: %s", body)
	}
}
