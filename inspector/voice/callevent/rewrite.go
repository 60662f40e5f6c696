package callevent

import (
	"encoding/json"
)

// Media link fields a payload may carry in its top-level media block.
const (
	FieldRecordingURL  = "recording_url"
	FieldTranscriptURL = "transcript_url"
)

// RewriteMediaURLs replaces the string values of media.recording_url and
// media.transcript_url in body with what replace returns for them, leaving
// every other byte as it was (a replay must differ from the original only
// where it has to). replace gets the field name and the current URL and
// returns the new URL and whether to replace it. The result reports how
// many values were replaced; a body that is not a JSON object, or has no
// such links, comes back unchanged.
func RewriteMediaURLs(body []byte, replace func(field, url string) (string, bool)) ([]byte, int) {
	type span struct {
		start, end int // the string token, quotes included
		value      string
	}
	var edits []span
	s := scanner{b: body}
	s.ws()
	if !s.members(func(key []byte) bool {
		if string(key) != "media" || s.peek() != '{' {
			return s.skip(1)
		}
		// Only the last media member counts, as in encoding/json.
		edits = edits[:0]
		return s.members(func(k []byte) bool {
			field := string(k)
			if (field != FieldRecordingURL && field != FieldTranscriptURL) || s.peek() != '"' {
				return s.skip(2)
			}
			start := s.i
			raw, escaped, ok := s.rawString()
			if !ok {
				return false
			}
			old := decode(raw, escaped)
			if nu, ok := replace(field, old); ok && nu != old {
				edits = append(edits, span{start, s.i, nu})
			}
			return true
		})
	}) {
		return body, 0
	}
	s.ws()
	if s.i != len(body) || len(edits) == 0 {
		return body, 0
	}
	out := make([]byte, 0, len(body)+64*len(edits))
	last := 0
	for _, e := range edits {
		quoted, _ := json.Marshal(e.value)
		out = append(out, body[last:e.start]...)
		out = append(out, quoted...)
		last = e.end
	}
	return append(out, body[last:]...), len(edits)
}
