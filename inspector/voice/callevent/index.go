package callevent

import (
	"encoding/json"
	"unicode/utf8"
)

// Indexed is what the agent stores beside every capture that is a call
// event, to list and group captures without parsing their bodies again.
type Indexed struct {
	Event      string // event kind, as sent (perhaps not one of the six)
	CallID     string // call.call_id
	DeliveryID string // the payload's id: unique per delivery
	OccurredAt string // as sent
}

// maxDepth bounds nesting, as encoding/json does, so that a hostile body
// cannot grow the stack without limit.
const maxDepth = 10000

// Index extracts the indexed fields of a call event from body. ok is false
// when body is not a call event: not a well-formed JSON object, or without a
// string "event", or with an event that is neither one of the six kinds nor
// accompanied by a "call" object. Fields of the wrong type are left empty.
//
// Index runs on the agent's path for every request, so it walks the bytes
// once without building values and allocates only the strings it returns.
func Index(body []byte) (ix Indexed, ok bool) {
	s := scanner{b: body}
	s.ws()
	hasCall := false
	if !s.members(func(key []byte) bool {
		switch string(key) {
		case "id":
			ix.DeliveryID, ok = s.stringOrSkip()
		case "event":
			ix.Event, ok = s.stringOrSkip()
		case "occurred_at":
			ix.OccurredAt, ok = s.stringOrSkip()
		case "call":
			// A repeated key replaces the earlier one, as in
			// encoding/json.
			ix.CallID, hasCall = "", s.peek() == '{'
			if hasCall {
				return s.callObject(&ix.CallID)
			}
			return s.skip(1)
		default:
			return s.skip(1)
		}
		return ok
	}) {
		return Indexed{}, false
	}
	s.ws()
	if s.i != len(s.b) {
		return Indexed{}, false
	}
	if ix.Event == "" || (!hasCall && !IsKind(ix.Event)) {
		return Indexed{}, false
	}
	return ix, true
}

// scanner walks JSON text. Every method leaves i after what it consumed and
// reports false on malformed input.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) expect(c byte) bool {
	if s.peek() != c {
		return false
	}
	s.i++
	return true
}

// members walks the object that starts at s.i, calling member for each
// key with the scanner at the member's value, which member must consume.
// It reports false on malformed input or when member does. Every object
// walk in this package goes through it, so they all agree on what a
// well-formed object is.
func (s *scanner) members(member func(key []byte) bool) bool {
	if !s.expect('{') {
		return false
	}
	s.ws()
	if s.peek() == '}' {
		s.i++
		return true
	}
	for {
		s.ws()
		key, ok := s.key()
		if !ok {
			return false
		}
		s.ws()
		if !s.expect(':') {
			return false
		}
		s.ws()
		if !member(key) {
			return false
		}
		s.ws()
		if s.peek() == ',' {
			s.i++
			continue
		}
		return s.expect('}')
	}
}

// rawString consumes a string and returns its contents between the quotes
// and whether it holds escapes.
func (s *scanner) rawString() (raw []byte, escaped, ok bool) {
	if !s.expect('"') {
		return nil, false, false
	}
	start := s.i
	for s.i < len(s.b) {
		// Most bytes of a string need no attention: skip them in a
		// tight loop.
		for s.i < len(s.b) && plain[s.b[s.i]] {
			s.i++
		}
		if s.i == len(s.b) {
			break
		}
		c := s.b[s.i]
		switch {
		case c == '"':
			raw = s.b[start:s.i]
			s.i++
			return raw, escaped, true
		case c == '\\':
			escaped = true
			s.i++
			switch s.peek() {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i++
			case 'u':
				if s.i+5 > len(s.b) || !isHex4(s.b[s.i+1:s.i+5]) {
					return nil, false, false
				}
				s.i += 5
			default:
				return nil, false, false
			}
		case c < 0x20:
			return nil, false, false
		default:
			s.i++
		}
	}
	return nil, false, false
}

// plain marks the bytes that stand for themselves inside a JSON string.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

func isHex4(b []byte) bool {
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// decode turns a string's raw contents into a Go string the way
// encoding/json does (invalid UTF-8 becomes U+FFFD).
func decode(raw []byte, escaped bool) string {
	if !escaped && utf8.Valid(raw) {
		return string(raw)
	}
	quoted := make([]byte, 0, len(raw)+2)
	quoted = append(append(append(quoted, '"'), raw...), '"')
	var out string
	if json.Unmarshal(quoted, &out) != nil {
		return ""
	}
	return out
}

// key reads an object key. The common unescaped case costs no allocation:
// callers compare string(key), which the compiler does without copying.
func (s *scanner) key() ([]byte, bool) {
	raw, escaped, ok := s.rawString()
	if !ok || !escaped {
		return raw, ok
	}
	return []byte(decode(raw, true)), true
}

// stringOrSkip returns a string value, or skips a value of another type
// and returns "".
func (s *scanner) stringOrSkip() (string, bool) {
	if s.peek() != '"' {
		return "", s.skip(1)
	}
	raw, escaped, ok := s.rawString()
	if !ok {
		return "", false
	}
	return decode(raw, escaped), true
}

// callObject walks the call block looking for call_id.
func (s *scanner) callObject(callID *string) bool {
	return s.members(func(key []byte) bool {
		if string(key) != "call_id" {
			return s.skip(2)
		}
		v, ok := s.stringOrSkip()
		if ok {
			*callID = v
		}
		return ok
	})
}

// skip consumes one value of any type at the given nesting depth.
func (s *scanner) skip(depth int) bool {
	if depth > maxDepth {
		return false
	}
	switch c := s.peek(); {
	case c == '"':
		_, _, ok := s.rawString()
		return ok
	case c == '{':
		return s.members(func([]byte) bool { return s.skip(depth + 1) })
	case c == '[':
		s.i++
		s.ws()
		if s.peek() == ']' {
			s.i++
			return true
		}
		for {
			s.ws()
			if !s.skip(depth + 1) {
				return false
			}
			s.ws()
			if s.peek() == ',' {
				s.i++
				continue
			}
			return s.expect(']')
		}
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || '0' <= c && c <= '9':
		return s.number()
	}
	return false
}

func (s *scanner) literal(lit string) bool {
	if len(s.b)-s.i < len(lit) || string(s.b[s.i:s.i+len(lit)]) != lit {
		return false
	}
	s.i += len(lit)
	return true
}

// number consumes -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) number() bool {
	s.expect('-')
	switch c := s.peek(); {
	case c == '0':
		s.i++
	case '1' <= c && c <= '9':
		s.digits()
	default:
		return false
	}
	if s.peek() == '.' {
		s.i++
		if s.digits() == 0 {
			return false
		}
	}
	if c := s.peek(); c == 'e' || c == 'E' {
		s.i++
		if c := s.peek(); c == '+' || c == '-' {
			s.i++
		}
		if s.digits() == 0 {
			return false
		}
	}
	return true
}

func (s *scanner) digits() int {
	start := s.i
	for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i - start
}
