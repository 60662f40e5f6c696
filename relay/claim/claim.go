// Package claim is how several agents share one relay token: each agent
// claims calls by what their events carry, and the relay hands a call to
// the agent whose claim its first event matches.
//
// A claim is written as an agent's --claim flag:
//
//	PATH=VALUE         a JSON dot path in the body: call.variables.developer=alice
//	header:NAME=VALUE  a request header: header:X-Developer=alice
//
// A claim matches a request when the body is a JSON object whose value at
// PATH is VALUE (a string compared as its text, a number or true/false/null
// as written), or when the request's header NAME is VALUE. A body that is
// not JSON, or lacks the path, matches no body claim.
//
// An agent's claims are a Set: any one matching claims the call. A Set is
// named by its Key, which names the agent's seat on the relay (its queue,
// its holder record) whichever order its flags came in.
package claim

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/textproto"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits on one claim: a flag, not a document.
const (
	MaxLen   = 512 // bytes of one claim as written
	MaxDepth = 16  // segments of a path
)

// HeaderPrefix starts a header claim.
const HeaderPrefix = "header:"

// Claim is one thing an agent claims calls by.
type Claim struct {
	Header string   // canonical header name; "" for a body claim
	Path   []string // the body claim's path, by segment
	Value  string
}

// Parse reads one claim as written; the error says what is wrong with it.
func Parse(expr string) (Claim, error) {
	if len(expr) > MaxLen {
		return Claim{}, fmt.Errorf("claim %.40q…: longer than %d bytes", expr, MaxLen)
	}
	if !utf8.ValidString(expr) || strings.ContainsFunc(expr, unicode.IsControl) {
		return Claim{}, fmt.Errorf("claim %q: not UTF-8 text, or holds a control character", expr)
	}
	if name, ok := strings.CutPrefix(expr, HeaderPrefix); ok {
		return parseHeader(expr, name)
	}
	path, value, ok := strings.Cut(expr, "=")
	if !ok {
		return Claim{}, fmt.Errorf("claim %q: want PATH=VALUE (a JSON dot path in the body, like call.variables.developer=alice) or header:NAME=VALUE", expr)
	}
	if value == "" {
		return Claim{}, fmt.Errorf("claim %q: the value after = is empty", expr)
	}
	segs := strings.Split(path, ".")
	if len(segs) > MaxDepth {
		return Claim{}, fmt.Errorf("claim %q: a path of more than %d segments", expr, MaxDepth)
	}
	for _, s := range segs {
		if s == "" || strings.TrimSpace(s) != s {
			return Claim{}, fmt.Errorf("claim %q: the path %q has an empty segment or spaces around one; write it as a.b.c", expr, path)
		}
	}
	return Claim{Path: segs, Value: value}, nil
}

func parseHeader(expr, rest string) (Claim, error) {
	name, value, ok := strings.Cut(rest, "=")
	if !ok || value == "" {
		return Claim{}, fmt.Errorf("claim %q: want header:NAME=VALUE with a value", expr)
	}
	if name == "" || !validHeaderName(name) {
		return Claim{}, fmt.Errorf("claim %q: %q is not a header name", expr, name)
	}
	return Claim{Header: textproto.CanonicalMIMEHeaderKey(name), Value: value}, nil
}

func validHeaderName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
		if !ok {
			return false
		}
	}
	return true
}

// String is the claim as written, in its canonical form.
func (c Claim) String() string {
	if c.Header != "" {
		return HeaderPrefix + c.Header + "=" + c.Value
	}
	return strings.Join(c.Path, ".") + "=" + c.Value
}

// Set is an agent's claims, sorted by their canonical form, without
// repeats. The empty Set is the team's default agent: it gets what no
// claim matches.
type Set []Claim

// ParseSet reads an agent's claims; the error names the first bad one.
func ParseSet(exprs []string) (Set, error) {
	var s Set
	for _, e := range exprs {
		c, err := Parse(e)
		if err != nil {
			return nil, err
		}
		s = append(s, c)
	}
	slices.SortFunc(s, func(a, b Claim) int { return strings.Compare(a.String(), b.String()) })
	return slices.CompactFunc(s, func(a, b Claim) bool { return a.String() == b.String() }), nil
}

// Strings are the claims as written, in the Set's order.
func (s Set) Strings() []string {
	out := make([]string, len(s))
	for i, c := range s {
		out[i] = c.String()
	}
	return out
}

// Key names the Set whatever the order it was written in: 16 hex digits,
// "" for the empty Set.
func (s Set) Key() string {
	if len(s) == 0 {
		return ""
	}
	h := sha256.New()
	for _, c := range s {
		h.Write([]byte(c.String()))
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// Shares reports the first claim s and o both hold.
func (s Set) Shares(o Set) (Claim, bool) {
	for _, a := range s {
		for _, b := range o {
			if a.String() == b.String() {
				return a, true
			}
		}
	}
	return Claim{}, false
}

// Matches reports whether any claim of s matches r.
func (s Set) Matches(r *Request) bool {
	for _, c := range s {
		if c.Matches(r) {
			return true
		}
	}
	return false
}

// Matches reports whether c matches r.
func (c Claim) Matches(r *Request) bool {
	if c.Header != "" {
		return r.header != nil && r.header(c.Header) == c.Value
	}
	v, ok := r.Lookup(c.Path)
	return ok && v == c.Value
}
