package callevent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"sort"
	"strings"

	"github.com/google/uuid"
)

// A Redactor replaces the personal fields of call events (the
// documentation's sections 6.5 and 6.6: the contact, the numbers dialled,
// the variables, the analysis's summaries and answers, the media links)
// with stand-ins, for fixtures that carry no people. The same value gets
// the same stand-in everywhere in one Redactor's life, so that calls,
// duplicates and timelines still line up; a stand-in keeps the value's
// form (a phone number stays E.164, an email an email, a link a link, a
// UUID a UUID). A value it replaced is replaced wherever else it shows
// (the raw data block, an answer, a header, a query), once Learn has seen
// every body: see Scrub.
type Redactor struct {
	rules    []redactRule
	standIns map[string]string // kind + "\x00" + value → stand-in
	byValue  map[string]string // value → its first stand-in, for Scrub
	counts   map[valueKind]int
	replacer *strings.Replacer // nil until sealed; rebuilt when values are added
	dirty    bool
}

type valueKind string

const (
	kindAny    valueKind = ""
	kindPhone  valueKind = "phone"
	kindEmail  valueKind = "email"
	kindLink   valueKind = "link"
	kindID     valueKind = "uuid"
	kindName   valueKind = "name"
	kindText   valueKind = "text"
	kindNumber valueKind = "number"
)

type redactRule struct {
	path []string // object keys from the top; arrays are walked through; "*" is any key
	kind valueKind
}

// RedactedFields are the personal fields of the documentation, as JSON
// paths (arrays are walked through: analysis.extracted_responses.answer is
// every item's answer). A path names its whole value: every string and
// number under call.variables is replaced, its keys kept.
var RedactedFields = []string{
	"call.from_number", "call.to_number",
	"call.contact.id", "call.contact.name", "call.contact.phone", "call.contact.email", "call.contact.custom_fields",
	"call.variables",
	"analysis.summary", "analysis.short_summary", "analysis.extracted_responses.answer",
	"media.recording_url", "media.transcript_url",
}

var documentedKinds = map[string]valueKind{
	"call.from_number": kindPhone, "call.to_number": kindPhone, "call.contact.phone": kindPhone,
	"call.contact.id": kindID, "call.contact.name": kindName, "call.contact.email": kindEmail,
	"analysis.summary": kindText, "analysis.short_summary": kindText,
	"media.recording_url": kindLink, "media.transcript_url": kindLink,
}

// minScrubbed is the shortest value Scrub looks for inside other text: a
// shorter one ("A", "42", "yes") would be found everywhere, in words and
// ids that have nothing to do with it. It is still replaced where it
// stands and wherever a whole JSON string equals it.
const minScrubbed = 4

// NewRedactor returns a Redactor for the documented fields and extra, each
// a dotted JSON path such as call.contact.custom_fields.ssn or
// data.room.name ("*" matches any one key).
func NewRedactor(extra []string) (*Redactor, error) {
	r := &Redactor{standIns: map[string]string{}, byValue: map[string]string{}, counts: map[valueKind]int{}}
	for _, p := range RedactedFields {
		r.rules = append(r.rules, redactRule{strings.Split(p, "."), documentedKinds[p]})
	}
	for _, p := range extra {
		parts := strings.Split(p, ".")
		for _, part := range parts {
			if part == "" {
				return nil, fmt.Errorf("--redact-path %q: want a dotted JSON path such as call.contact.custom_fields.city", p)
			}
		}
		r.rules = append(r.rules, redactRule{parts, kindAny})
	}
	return r, nil
}

// Paths returns the JSON paths the Redactor replaces.
func (r *Redactor) Paths() []string {
	out := make([]string, len(r.rules))
	for i, rule := range r.rules {
		out[i] = strings.Join(rule.path, ".")
	}
	return out
}

// rule returns the rule covering a leaf at path, or false.
func (r *Redactor) rule(path []string) (redactRule, bool) {
	for _, rule := range r.rules {
		if len(path) < len(rule.path) {
			continue
		}
		ok := true
		for i, p := range rule.path {
			if p != "*" && p != path[i] {
				ok = false
				break
			}
		}
		if ok {
			return rule, true
		}
	}
	return redactRule{}, false
}

// Learn records the stand-ins of body's personal fields without changing
// it. Learning every body of an export before redacting any lets Scrub
// find a value in a capture that comes before the one whose field holds it.
func (r *Redactor) Learn(body []byte) {
	r.walk(body, false)
}

// Body returns body with its personal fields replaced and, anywhere else,
// every value replaced so far scrubbed out. A body that is not JSON is
// scrubbed as text.
func (r *Redactor) Body(body []byte) []byte {
	if out, ok := r.walk(body, true); ok {
		return out
	}
	return []byte(r.Scrub(string(body)))
}

// walk visits the string and number leaves of the JSON value body; with
// edit it returns body with the personal ones replaced and the others
// scrubbed, every other byte as it was. ok is false when body is not JSON.
func (r *Redactor) walk(body []byte, edit bool) (_ []byte, ok bool) {
	type span struct {
		start, end int
		text       []byte
	}
	var edits []span
	s := scanner{b: body}
	s.ws()
	if s.i == len(body) {
		return body, false
	}
	leaf := func(path []string, start int) bool {
		raw := body[start:s.i]
		isString := raw[0] == '"'
		value := string(raw)
		if isString {
			value = decode(raw[1:len(raw)-1], bytes.IndexByte(raw, '\\') >= 0)
		}
		if rule, ok := r.rule(path); ok {
			kind := rule.kind
			if !isString {
				kind = kindNumber
			}
			standIn := r.standIn(kind, value)
			if edit {
				text := []byte(standIn)
				if isString {
					text = quote(standIn)
				}
				edits = append(edits, span{start, s.i, text})
			}
			return true
		}
		if edit && isString {
			if nu := r.Scrub(value); nu != value {
				edits = append(edits, span{start, s.i, quote(nu)})
			}
		}
		return true
	}
	if !s.leaves(nil, 0, leaf) {
		return body, false
	}
	s.ws()
	if s.i != len(body) {
		return body, false
	}
	if len(edits) == 0 {
		return body, true
	}
	out := make([]byte, 0, len(body))
	last := 0
	for _, e := range edits {
		out = append(append(out, body[last:e.start]...), e.text...)
		last = e.end
	}
	return append(out, body[last:]...), true
}

// quote is s as a JSON string, <, > and & as they are.
func quote(s string) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(s)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// leaves walks one value, calling leaf for each string and number with
// the keys that lead to it; leaf finds the leaf's text at b[start:s.i].
func (s *scanner) leaves(path []string, depth int, leaf func(path []string, start int) bool) bool {
	if depth > maxDepth {
		return false
	}
	switch c := s.peek(); {
	case c == '{':
		return s.members(func(key []byte) bool {
			return s.leaves(append(path[:len(path):len(path)], string(key)), depth+1, leaf)
		})
	case c == '[':
		s.i++
		s.ws()
		if s.peek() == ']' {
			s.i++
			return true
		}
		for {
			s.ws()
			if !s.leaves(path, depth+1, leaf) {
				return false
			}
			s.ws()
			if s.peek() == ',' {
				s.i++
				continue
			}
			return s.expect(']')
		}
	case c == '"' || c == '-' || '0' <= c && c <= '9':
		start := s.i
		return s.skip(depth) && leaf(path, start)
	}
	return s.skip(depth)
}

var emailRE = regexp.MustCompile(`^[^@\s]+@[^@\s]+\.[^@\s]+$`)

// shape is the kind a value of no declared kind looks like.
func shape(v string) valueKind {
	switch {
	case IsUUID(v):
		return kindID
	case emailRE.MatchString(v):
		return kindEmail
	case phoneRE.MatchString(v):
		return kindPhone
	}
	if u, err := url.Parse(v); err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" {
		return kindLink
	}
	return kindText
}

// standIn returns value's stand-in as a kind, making one the first time.
func (r *Redactor) standIn(kind valueKind, value string) string {
	switch {
	case kind == kindAny:
		kind = shape(value)
	case kind == kindID && !IsUUID(value):
		kind = kindText
	}
	key := string(kind) + "\x00" + value
	if s, ok := r.standIns[key]; ok {
		return s
	}
	r.counts[kind]++
	n := r.counts[kind]
	var s string
	switch kind {
	case kindPhone:
		s = fmt.Sprintf("+1555%07d", n) // NANP's 555 exchange: fictional
	case kindEmail:
		s = fmt.Sprintf("person-%d@example.com", n)
	case kindLink:
		s = fmt.Sprintf("https://example.com/redacted/%d", n)
	case kindID:
		s = uuid.NewString()
	case kindName:
		s = fmt.Sprintf("Person %d", n)
	case kindNumber:
		s = fmt.Sprint(n)
	default:
		s = fmt.Sprintf("redacted-%d", n)
	}
	r.standIns[key] = s
	if _, ok := r.byValue[value]; !ok && value != "" {
		r.byValue[value] = s
		r.dirty = true
	}
	return s
}

// Scrub returns s with every value replaced so far, longest first, put
// back as its stand-in wherever it shows: as it is, JSON-escaped, or
// escaped for a URL's query or path. A value shorter than minScrubbed is
// only replaced when it is the whole of s.
func (r *Redactor) Scrub(s string) string {
	if s == "" {
		return s
	}
	if standIn, ok := r.byValue[s]; ok {
		return standIn
	}
	if r.dirty || r.replacer == nil {
		r.seal()
	}
	return r.replacer.Replace(s)
}

// seal builds the replacer of Scrub from the values known so far.
func (r *Redactor) seal() {
	type pair struct{ old, nu string }
	var pairs []pair
	seen := map[string]bool{}
	for v, standIn := range r.byValue {
		if len(v) < minScrubbed {
			continue
		}
		esc := string(quote(v))
		for _, form := range []struct{ old, nu string }{
			{v, standIn},
			{esc[1 : len(esc)-1], string(quote(standIn)[1 : len(quote(standIn))-1])},
			{url.QueryEscape(v), url.QueryEscape(standIn)},
			{url.PathEscape(v), url.PathEscape(standIn)},
		} {
			if !seen[form.old] {
				seen[form.old] = true
				pairs = append(pairs, pair(form))
			}
		}
	}
	// The replacer tries its pairs in order at each place: the longest
	// first, so that "Ann Lee" goes before "Ann".
	sort.Slice(pairs, func(i, j int) bool {
		if len(pairs[i].old) != len(pairs[j].old) {
			return len(pairs[i].old) > len(pairs[j].old)
		}
		return pairs[i].old < pairs[j].old
	})
	args := make([]string, 0, 2*len(pairs))
	for _, p := range pairs {
		args = append(args, p.old, p.nu)
	}
	r.replacer = strings.NewReplacer(args...)
	r.dirty = false
}
