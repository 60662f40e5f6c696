package inspector

import (
	"errors"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/calltap/calltap/inspector/agent/mediasave"
	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

// The media endpoints serve the copies the agent's media saver
// (mediasave.Saver) made of the recordings and transcripts that call
// events link to.

// MediaFileJSON is a media file in the API.
type MediaFileJSON struct {
	ID          string  `json:"id"`
	CaptureID   string  `json:"capture_id"`
	CallID      string  `json:"call_id"`
	Kind        string  `json:"kind"` // recording | transcript
	SourceURL   string  `json:"source_url"`
	ExpiresAt   *string `json:"expires_at"`
	Expired     bool    `json:"expired"` // the signed link has run out
	Status      string  `json:"status"`  // pending | saved | failed
	Attempts    int     `json:"attempts"`
	Error       string  `json:"error"`
	Size        *int64  `json:"size"`
	ContentType string  `json:"content_type"`
	SHA256      string  `json:"sha256"`
	CreatedAt   *string `json:"created_at"`
	SavedAt     *string `json:"saved_at"`
	URL         *string `json:"url"` // where the inspector serves the copy, once saved
}

// MediaFileOf renders a media record for the API.
func MediaFileOf(f *agentdb.MediaFile) MediaFileJSON {
	j := MediaFileJSON{ID: f.ID, CaptureID: f.CaptureID, CallID: f.CallID, Kind: f.Kind, SourceURL: f.SourceURL,
		ExpiresAt: api.Time(f.ExpiresAt), Expired: !f.ExpiresAt.IsZero() && time.Now().After(f.ExpiresAt),
		Status: f.Status, Attempts: f.Attempts, Error: f.Error, ContentType: f.ContentType, SHA256: f.SHA256,
		CreatedAt: api.Time(f.CreatedAt), SavedAt: api.Time(f.SavedAt)}
	if f.Status == agentdb.MediaSaved {
		size, u := f.Size, mediasave.URLPath(f.ID)
		j.Size, j.URL = &size, &u
	}
	return j
}

// MediaRoutes registers the media endpoints on mux:
//
//	GET /api/v1/ext/media/?call_id&capture_id&kind&status&limit&offset  page of media files, newest first
//	GET /api/v1/ext/media/{id}/                                          one record
//	GET /api/v1/ext/media/{id}                                           the saved file (Range supported; ?download=1)
func MediaRoutes(mux *http.ServeMux, db *agentdb.AgentStore, dir string) {
	mux.HandleFunc("GET /api/v1/ext/media/{$}", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		limit, offset, err := api.ParsePage(q)
		if err != nil {
			api.WriteError(w, err)
			return
		}
		files, count, err := db.MediaFiles(r.Context(), agentdb.MediaFilter{CallID: q.Get("call_id"), CaptureID: q.Get("capture_id"),
			Kind: q.Get("kind"), Status: q.Get("status"), Page: storage.Page{Limit: limit, Offset: offset}})
		if err != nil {
			api.WriteError(w, err)
			return
		}
		out := make([]MediaFileJSON, len(files))
		for i, f := range files {
			out[i] = MediaFileOf(f)
		}
		api.WriteData(w, http.StatusOK, "", api.NewPage(count, limit, offset, out))
	})
	mux.HandleFunc("GET /api/v1/ext/media/{id}/{$}", func(w http.ResponseWriter, r *http.Request) {
		f, err := db.Media(r.Context(), r.PathValue("id"))
		if errors.Is(err, storage.ErrNotFound) {
			err = api.NotFound("media file")
		}
		if err != nil {
			api.WriteError(w, err)
			return
		}
		api.WriteData(w, http.StatusOK, "", MediaFileOf(f))
	})
	mux.HandleFunc("GET /api/v1/ext/media/{id}", func(w http.ResponseWriter, r *http.Request) {
		serveMediaFile(w, r, db, dir)
	})
}

// mediaInline lists the types shown in the browser; anything else (HTML,
// SVG, scripts) is served as a download, so a hostile recording cannot run
// in the inspector's origin.
func mediaInline(ctype string) bool {
	mt, _, _ := mime.ParseMediaType(ctype)
	return strings.HasPrefix(mt, "audio/") || strings.HasPrefix(mt, "video/") || mt == "application/json" || mt == "text/plain"
}

func serveMediaFile(w http.ResponseWriter, r *http.Request, db *agentdb.AgentStore, dir string) {
	f, err := db.Media(r.Context(), r.PathValue("id"))
	if errors.Is(err, storage.ErrNotFound) {
		err = api.NotFound("media file")
	}
	if err != nil {
		api.WriteError(w, err)
		return
	}
	if f.Status != agentdb.MediaSaved || f.File == "" {
		api.WriteError(w, api.Errorf(http.StatusNotFound, api.CodeNotFound, "media file is not saved (status %s)", f.Status))
		return
	}
	// File names are ours, but the database is a file on disk too.
	if filepath.Base(f.File) != f.File || strings.HasPrefix(f.File, ".") {
		api.WriteError(w, api.Errorf(http.StatusNotFound, api.CodeNotFound, "media file not found"))
		return
	}
	fh, err := os.Open(filepath.Join(dir, f.File))
	if errors.Is(err, os.ErrNotExist) {
		api.WriteError(w, api.Errorf(http.StatusNotFound, api.CodeNotFound, "media file %s is missing from %s", f.File, dir))
		return
	} else if err != nil {
		api.WriteError(w, err)
		return
	}
	defer fh.Close()
	ctype, disposition := f.ContentType, "inline"
	if !mediaInline(ctype) {
		ctype, disposition = "application/octet-stream", "attachment"
	}
	if r.URL.Query().Get("download") != "" {
		disposition = "attachment"
	}
	h := w.Header()
	h.Set("Content-Type", ctype)
	h.Set("Content-Disposition", mime.FormatMediaType(disposition, map[string]string{"filename": f.CallID + "-" + f.Kind + filepath.Ext(f.File)}))
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "sandbox; default-src 'none'")
	if f.SHA256 != "" {
		h.Set("ETag", `"`+f.SHA256+`"`)
	}
	http.ServeContent(w, r, "", f.SavedAt, fh)
}
