package routes

import (
	"bytes"
	"encoding/json"
	"strings"
)

// trie holds the dot paths Match reads from a body, so that one pass over
// the JSON takes them all and skips every other value without decoding it:
// Match is on the path of every forwarded request.
type trie struct {
	kids map[string]*trie
	slot int // index into the fields; -1: only a prefix of a path
}

func newTrie() *trie { return &trie{slot: -1} }

func (t *trie) add(dotPath string, slot int) {
	for seg := range strings.SplitSeq(dotPath, ".") {
		if t.kids == nil {
			t.kids = map[string]*trie{}
		}
		next := t.kids[seg]
		if next == nil {
			next = newTrie()
			t.kids[seg] = next
		}
		t = next
	}
	t.slot = slot
}

// field is a body value at one of the table's paths: its raw JSON, not
// decoded until compared.
type field struct {
	raw   []byte // for a string, without the quotes
	str   bool
	esc   bool // a string with escapes: unquote before use
	found bool
}

// text is the field's value as a route compares it: a string's text, or
// the JSON of a number, boolean or object.
func (f field) text() string {
	if f.esc {
		var s string
		if json.Unmarshal(append(append([]byte{'"'}, f.raw...), '"'), &s) == nil {
			return s
		}
	}
	return string(f.raw)
}

// equal reports whether the field's value is want, without allocating for
// the common case of a string without escapes.
func (f field) equal(want string) bool {
	if f.esc {
		return f.text() == want
	}
	return string(f.raw) == want
}

// present is true for a value that is there and not null.
func (f field) present() bool { return f.found && (f.str || string(f.raw) != "null") }

// scanner reads a JSON body once. A body that is not JSON, or is cut short,
// leaves the fields found so far: such a request matches on what it has.
type scanner struct {
	b      []byte
	i      int
	fields []field
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\r', '\n':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// object reads the object at s.i, taking the values at t's paths.
func (s *scanner) object(t *trie) bool {
	s.i++ // '{'
	for {
		s.ws()
		switch s.peek() {
		case '}':
			s.i++
			return true
		case ',':
			s.i++
			continue
		case '"':
		default:
			return false
		}
		key, esc, ok := s.str()
		if !ok {
			return false
		}
		s.ws()
		if s.peek() != ':' {
			return false
		}
		s.i++
		s.ws()
		if !s.member(t.kid(key, esc)) {
			return false
		}
	}
}

func (t *trie) kid(key []byte, esc bool) *trie {
	if esc {
		return t.kids[field{raw: key, str: true, esc: true}.text()]
	}
	return t.kids[string(key)] // no allocation: a map index by a converted []byte
}

// member reads the value at s.i of a key whose node is t (nil: not wanted).
func (s *scanner) member(t *trie) bool {
	if t == nil {
		return s.skip()
	}
	start := s.i
	var ok bool
	if t.kids != nil && s.peek() == '{' {
		ok = s.object(t)
	} else {
		ok = s.skip()
	}
	if ok && t.slot >= 0 {
		f := field{raw: s.b[start:s.i], found: true}
		if len(f.raw) >= 2 && f.raw[0] == '"' {
			f.str, f.raw = true, f.raw[1:len(f.raw)-1]
			f.esc = bytes.IndexByte(f.raw, '\\') >= 0
		}
		s.fields[t.slot] = f
	}
	return ok
}

// str reads the string at s.i and returns its contents.
func (s *scanner) str() (raw []byte, esc, ok bool) {
	start := s.i + 1
	for i := start; i < len(s.b); i++ {
		switch s.b[i] {
		case '\\':
			esc = true
			i++
		case '"':
			s.i = i + 1
			return s.b[start:i], esc, true
		}
	}
	return nil, false, false
}

// skip passes over the value at s.i.
func (s *scanner) skip() bool {
	switch s.peek() {
	case '"':
		_, _, ok := s.str()
		return ok
	case '{', '[':
		return s.skipNested()
	case 0:
		return false
	}
	for s.i < len(s.b) && !strings.ContainsRune(",}] \t\r\n", rune(s.b[s.i])) {
		s.i++
	}
	return true
}

// skipNested passes over an object or array, minding strings.
func (s *scanner) skipNested() bool {
	depth := 0
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case '"':
			if _, _, ok := s.str(); !ok {
				return false
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				s.i++
				return true
			}
		}
		s.i++
	}
	return false
}

// scan fills fields (one per slot) from body.
func scan(body []byte, t *trie, fields []field) {
	s := scanner{b: body, fields: fields}
	s.ws()
	if s.peek() == '{' {
		s.object(t)
	}
}
