// What a claim is matched against: a request's headers, and its body read
// in place. The body is checked once (json.Valid) and then each path is
// found by skipping over what is not on it, without decoding the body
// into values: the relay does this for every request of a token with
// claims, and an event is mostly the parts no claim names.

package claim

import (
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// CallIDPath is where an event carries its call's id.
var CallIDPath = []string{"call", "call_id"}

// Request is one request as claims see it.
type Request struct {
	body   []byte
	header func(name string) string
	valid  int8 // 0 not checked yet, 1 a JSON object, -1 not
}

// NewRequest is a request with body and a header getter (canonical names).
func NewRequest(body []byte, header func(name string) string) *Request {
	return &Request{body: body, header: header}
}

// CallID is the call the request's event is about, "" if it names none.
func (r *Request) CallID() string {
	v, _ := r.Lookup(CallIDPath)
	return v
}

// Lookup returns the text of the scalar at path in the body: a string's
// value, a number, true, false or null as written. ok is false when the
// body is not a JSON object, the path is not in it, or it leads to an
// object or array.
func (r *Request) Lookup(path []string) (string, bool) {
	if r.valid == 0 {
		r.valid = -1
		if b := trimSpace(r.body); len(b) > 0 && b[0] == '{' && json.Valid(b) {
			r.valid = 1
		}
	}
	if r.valid < 0 {
		return "", false
	}
	v := trimSpace(r.body)
	for _, key := range path {
		var ok bool
		if v, ok = member(v, key); !ok {
			return "", false
		}
	}
	return scalar(v)
}

// member returns the raw value of key in obj, a valid JSON object; the
// last one when a key repeats, as encoding/json decodes it.
func member(obj []byte, key string) ([]byte, bool) {
	if len(obj) == 0 || obj[0] != '{' {
		return nil, false
	}
	var found []byte
	i := 1
	for {
		i = skipSpace(obj, i)
		if i >= len(obj) || obj[i] != '"' {
			return found, found != nil
		}
		ke := skipString(obj, i)
		k := obj[i:ke]
		i = skipSpace(obj, ke) + 1 // the colon
		i = skipSpace(obj, i)
		ve := skipValue(obj, i)
		if keyIs(k, key) {
			found = obj[i:ve]
		}
		i = skipSpace(obj, ve)
		if i < len(obj) && obj[i] == ',' {
			i++
		}
	}
}

// keyIs reports whether the quoted JSON string k is key.
func keyIs(k []byte, key string) bool {
	raw := k[1 : len(k)-1]
	if plainText(raw) {
		return string(raw) == key
	}
	var s string
	return json.Unmarshal(k, &s) == nil && s == key
}

// scalar is the text a claim compares a value by.
func scalar(v []byte) (string, bool) {
	if len(v) == 0 || v[0] == '{' || v[0] == '[' {
		return "", false
	}
	if v[0] != '"' {
		return string(v), true
	}
	if raw := v[1 : len(v)-1]; plainText(raw) {
		return string(raw), true
	}
	var s string
	if json.Unmarshal(v, &s) != nil {
		return "", false
	}
	return s, true
}

// plainText reports whether a JSON string's raw bytes are its text: no
// escape, and valid UTF-8 (encoding/json reads an invalid byte as U+FFFD).
func plainText(raw []byte) bool {
	return !strings.ContainsRune(string(raw), '\\') && utf8.Valid(raw)
}

// skipString returns the index after the string starting at b[i].
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// skipValue returns the index after the value starting at b[i].
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = skipString(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return len(b)
	}
	for ; i < len(b); i++ {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\r', '\n':
			return i
		}
	}
	return i
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

func trimSpace(b []byte) []byte {
	b = b[skipSpace(b, 0):]
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\r' || b[len(b)-1] == '\n') {
		b = b[:len(b)-1]
	}
	return b
}
