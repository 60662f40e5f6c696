package tunnelpath_test

import (
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/calltap/calltap/relay/tunnelpath"
)

// FuzzPathRule checks the rule against a model of a lenient server behind
// the agent: one that percent-decodes again and again (%uXXXX too),
// decodes overlong UTF-8, folds Unicode look-alikes of ASCII (the
// fullwidth forms, dot leaders, other spaces) as NFKC does, stops at a NUL
// and trims trailing spaces and tabs from a segment. A path the rule lets
// through must never resolve to a "." or ".." segment there.
func FuzzPathRule(f *testing.F) {
	for _, p := range refused(f) {
		f.Add(p)
	}
	for _, p := range []string{"/calls/events", "/caf%C3%A9", "/a..b/.c", "/%ef%bc%85%32%65", "/％２ｅ％２ｅ/x", "/%u2024%u2024"} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if tunnelpath.Check(p) != nil {
			return
		}
		for _, seg := range lenientSegments(p) {
			if seg == "." || seg == ".." {
				t.Fatalf("Check(%q) passed, but a lenient server resolves it to a %q segment (%q)", p, seg, lenientSegments(p))
			}
		}
	})
}

// lenientSegments is the model: what a lenient server makes of path p.
func lenientSegments(p string) []string {
	s := p
	for range 64 {
		next := foldLookAlikes(decodeOverlong(percentDecode(s)))
		if next == s {
			break
		}
		s = next
	}
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	var segs []string
	for _, seg := range strings.FieldsFunc(s, func(r rune) bool { return r == '/' || r == '\\' }) {
		seg, _, _ = strings.Cut(seg, ";")
		segs = append(segs, strings.TrimRight(seg, " \t"))
	}
	return segs
}

// percentDecode decodes %XX and %uXXXX wherever they are well formed.
func percentDecode(s string) string {
	var out []byte
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+3 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				out = append(out, byte(v))
				i += 2
				continue
			}
		}
		if s[i] == '%' && i+6 <= len(s) && (s[i+1] == 'u' || s[i+1] == 'U') {
			if v, err := strconv.ParseUint(s[i+2:i+6], 16, 16); err == nil {
				out = utf8.AppendRune(out, rune(v))
				i += 5
				continue
			}
		}
		out = append(out, s[i])
	}
	return string(out)
}

// decodeOverlong decodes UTF-8 sequences as a careless decoder does: by
// their bits alone, so that C0 AE is '.' and C0 AF is '/'.
func decodeOverlong(s string) string {
	var out []byte
	for i := 0; i < len(s); {
		b := s[i]
		n, mask := 0, byte(0)
		switch {
		case b&0xE0 == 0xC0:
			n, mask = 1, 0x1F
		case b&0xF0 == 0xE0:
			n, mask = 2, 0x0F
		case b&0xF8 == 0xF0:
			n, mask = 3, 0x07
		}
		if n == 0 || i+n >= len(s) {
			out = append(out, b)
			i++
			continue
		}
		r := rune(b & mask)
		ok := true
		for k := 1; k <= n; k++ {
			c := s[i+k]
			if c&0xC0 != 0x80 {
				ok = false
				break
			}
			r = r<<6 | rune(c&0x3F)
		}
		if !ok {
			out = append(out, b)
			i++
			continue
		}
		out = utf8.AppendRune(out, r)
		i += n + 1
	}
	return string(out)
}

// foldLookAlikes maps what NFKC turns into ASCII punctuation, digits,
// letters or a space: the fullwidth forms, the small forms, the dot
// leaders and the other spaces.
func foldLookAlikes(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteByte(s[i]) // a stray byte stays as it is
			i++
			continue
		}
		i += size
		switch {
		case r >= 0xFF01 && r <= 0xFF5E:
			b.WriteRune(r - 0xFEE0)
		case r == 0x2024 || r == 0xFE52:
			b.WriteByte('.')
		case r == 0x2025:
			b.WriteString("..")
		case r == 0x2026:
			b.WriteString("...")
		case r == 0xFE6A:
			b.WriteByte('%')
		case r == 0xFE54:
			b.WriteByte(';')
		case r == 0x00A0 || r == 0x3000 || r >= 0x2000 && r <= 0x200A || r == 0x202F || r == 0x205F:
			b.WriteByte(' ')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
