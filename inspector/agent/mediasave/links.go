package mediasave

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

// URLPath is where the inspector serves a saved file.
func URLPath(id string) string { return "/api/v1/ext/media/" + url.PathEscape(id) }

// RewriteLinks points the media links of a payload at the saved
// copies, served by the inspector at inspectorURL (such as
// "http://127.0.0.1:4040"), for replays made after the signed originals
// expired (--rewrite-media). A link is matched by its URL, else by the
// call and kind of a saved file. Links without a saved copy are left as
// they are; n says how many were rewritten. Other bytes are unchanged.
func RewriteLinks(ctx context.Context, db *agentdb.AgentStore, body []byte, inspectorURL string) (out []byte, n int, err error) {
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
		return base + URLPath(files[0].ID), true
	})
	if err != nil {
		return body, 0, err
	}
	return out, n, nil
}

// ParseLinks reads the links of a call's files from the data of the
// service's GET /call_logs/{id}/media/ (documentation section 4.4). Its
// shape is "not shown", so the links are looked for leniently:
// recording_url and transcript_url (also inside a media object), or a
// single url, link or download_url taken as the recording, or data being
// the URL itself.
func ParseLinks(data json.RawMessage) callevent.Media { return linksFromData(data) }

func linksFromData(data json.RawMessage) callevent.Media {
	var s string
	if json.Unmarshal(data, &s) == nil {
		return callevent.Media{RecordingURL: s}
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(data, &obj) != nil {
		return callevent.Media{}
	}
	if inner, ok := obj["media"]; ok {
		if m := linksFromData(inner); m.RecordingURL != "" || m.TranscriptURL != "" {
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
