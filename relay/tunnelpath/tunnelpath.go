// Package tunnelpath is the one rule for the path a sender puts after a
// tunnel id (/t/<id>/<path>). The agent appends that path to the base path
// of its local handler, so a path that some server on the way could resolve
// to "." or ".." would lead out of that base. The rule is an allow-list in
// effect: at every level of percent-decoding the path must be valid UTF-8,
// free of control and invisible format characters, and have no segment
// made only of dots and spaces, in ASCII or in any Unicode form that NFKC
// folds to them (fullwidth dot, one-dot leader, …). The relay, the agent
// and replay all ask Check.
package tunnelpath

import (
	"errors"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Why a path is refused. Each reads after "the path ".
var (
	ErrNotUTF8    = errors.New("is not valid UTF-8 once decoded (overlong or stray bytes)")
	ErrControl    = errors.New("holds a control or invisible character once decoded")
	ErrDotSegment = errors.New("has a dot segment: a segment made only of dots and spaces (. or .. in some spelling), in any encoding")
	ErrTooDeep    = errors.New("is percent-encoded more levels deep than any real path")
)

// maxLevels bounds the decoding: each level removes at least one escape,
// and a real path is encoded once, twice at most.
const maxLevels = 16

// Check reports whether the escaped path p (without its query) may be
// forwarded: nil, or one of the errors above. It decodes p again and again,
// as a chain of lenient servers might (%252e → %2e → .), and checks every
// level, both as it is and folded by NFKC (so a fullwidth percent sign
// counts as one and a fullwidth solidus as a separator).
func Check(p string) error {
	for level := 0; ; level++ {
		if level == maxLevels {
			return ErrTooDeep
		}
		if err := checkLevel(p); err != nil {
			return err
		}
		folded := p
		if !isASCII(p) {
			folded = norm.NFKC.String(p)
			if err := checkLevel(folded); err != nil {
				return err
			}
		}
		next := unescapeLenient(folded)
		if next == p {
			return nil
		}
		p = next
	}
}

// checkLevel checks one decoded form of the path.
func checkLevel(s string) error {
	if !utf8.ValidString(s) {
		return ErrNotUTF8
	}
	for _, r := range s {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			return ErrControl
		}
	}
	for _, seg := range strings.FieldsFunc(s, func(r rune) bool { return r == '/' || r == '\\' }) {
		seg, _, _ = strings.Cut(seg, ";") // a path parameter (..;/x)
		if dotsAndSpaces(seg) {
			return ErrDotSegment
		}
	}
	return nil
}

// dotsAndSpaces reports whether seg has a dot and nothing but dots and
// spaces: "." and ".." themselves, and what a server that trims trailing
// dots or spaces (Windows does) may take for them (".. ", "...").
func dotsAndSpaces(seg string) bool {
	dot := false
	for _, r := range seg {
		switch {
		case r == '.':
			dot = true
		case unicode.IsSpace(r):
		default:
			return false
		}
	}
	return dot
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// unescapeLenient decodes every valid %XX, and %uXXXX as IIS does, and
// keeps anything else as it is, so that one bad escape does not hide the
// others.
func unescapeLenient(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' {
			if i+2 < len(s) {
				if hi, lo := unhex(s[i+1]), unhex(s[i+2]); hi >= 0 && lo >= 0 {
					b.WriteByte(byte(hi<<4 | lo))
					i += 2
					continue
				}
			}
			if i+5 < len(s) && (s[i+1] == 'u' || s[i+1] == 'U') {
				if r, ok := hex4(s[i+2 : i+6]); ok {
					b.WriteRune(r)
					i += 5
					continue
				}
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func hex4(s string) (rune, bool) {
	var r rune
	for i := 0; i < 4; i++ {
		d := unhex(s[i])
		if d < 0 {
			return 0, false
		}
		r = r<<4 | rune(d)
	}
	return r, true
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c - 'a' + 10)
	case c >= 'A' && c <= 'F':
		return int(c - 'A' + 10)
	}
	return -1
}
