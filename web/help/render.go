package help

import (
	"fmt"
	"html"
	"strings"
	"text/tabwriter"
)

// An inline span of a topic's text: plain, `code`, **strong** or a
// [link](target).
type span struct {
	kind   spanKind
	text   string
	target string // a link's
}

type spanKind int

const (
	plain spanKind = iota
	codeSpan
	strong
	link
)

// inline splits Markdown text into spans. Unclosed markers are text.
func inline(s string) []span {
	var out []span
	for s != "" {
		i := strings.IndexAny(s, "`*[")
		if i < 0 {
			return append(out, span{kind: plain, text: s})
		}
		sp, rest, ok := marked(s[i:])
		if !ok {
			out = append(out, span{kind: plain, text: s[:i+1]})
			s = s[i+1:]
			continue
		}
		if i > 0 {
			out = append(out, span{kind: plain, text: s[:i]})
		}
		out = append(out, sp)
		s = rest
	}
	return out
}

// marked reads the marked span s starts with, and what follows it.
func marked(s string) (span, string, bool) {
	switch {
	case strings.HasPrefix(s, "`"):
		if end := strings.Index(s[1:], "`"); end >= 0 {
			return span{kind: codeSpan, text: s[1 : 1+end]}, s[2+end:], true
		}
	case strings.HasPrefix(s, "**"):
		if end := strings.Index(s[2:], "**"); end > 0 {
			return span{kind: strong, text: s[2 : 2+end]}, s[4+end:], true
		}
	case strings.HasPrefix(s, "["):
		close := strings.Index(s, "](")
		end := strings.Index(s, ")")
		if close > 0 && end > close {
			return span{kind: link, text: s[1:close], target: s[close+2 : end]}, s[end+1:], true
		}
	}
	return span{}, "", false
}

// inlineText is text for a terminal: the markers gone, a link's target in
// brackets after it (unless it is a place in the same text).
func inlineText(s string) string {
	var b strings.Builder
	for _, sp := range inline(s) {
		b.WriteString(sp.text)
		if sp.kind == link && !strings.HasPrefix(sp.target, "#") {
			fmt.Fprintf(&b, " (%s)", sp.target)
		}
	}
	return b.String()
}

// inlineHTML is text as HTML, every character of it escaped. A link is a
// link only to a place in the help or on the web; other targets are text.
func inlineHTML(s string) string {
	var b strings.Builder
	for _, sp := range inline(s) {
		t := html.EscapeString(sp.text)
		switch sp.kind {
		case codeSpan:
			b.WriteString("<code>" + t + "</code>")
		case strong:
			b.WriteString("<strong>" + t + "</strong>")
		case link:
			b.WriteString(linkHTML(t, sp.target))
		default:
			b.WriteString(t)
		}
	}
	return b.String()
}

func linkHTML(text, target string) string {
	switch {
	case strings.HasPrefix(target, "https://"), strings.HasPrefix(target, "http://"), strings.HasPrefix(target, "#"):
		return `<a href="` + html.EscapeString(target) + `">` + text + `</a>`
	case strings.HasPrefix(target, "help:"): // another topic
		return `<a href="/help/` + html.EscapeString(strings.TrimPrefix(target, "help:")) + `">` + text + `</a>`
	}
	return text
}

// renderText writes blocks for a terminal: headings underlined, lists
// dashed, code indented, tables in columns.
func renderText(blocks []block) string {
	var b strings.Builder
	for i, bl := range blocks {
		if i > 0 {
			b.WriteString("\n")
		}
		switch bl.kind {
		case heading:
			t := inlineText(bl.text)
			b.WriteString(t + "\n" + strings.Repeat(underline(bl.level), len([]rune(t))) + "\n")
		case paragraph:
			b.WriteString(wrap(inlineText(bl.text), 80, "") + "\n")
		case list:
			for _, it := range bl.items {
				b.WriteString(wrap("- "+inlineText(it), 80, "  ") + "\n")
			}
		case code:
			for _, l := range bl.code {
				b.WriteString("    " + l + "\n")
			}
		case table:
			b.WriteString(textTable(bl.rows))
		}
	}
	return b.String()
}

func underline(level int) string {
	if level <= 1 {
		return "="
	}
	return "-"
}

// textTable lines a table's cells up in columns.
func textTable(rows [][]string) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	for _, r := range rows {
		cells := make([]string, len(r))
		for i, c := range r {
			cells[i] = inlineText(c)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	tw.Flush()
	return b.String()
}

// wrap folds s at spaces into lines of at most width runes (a longer word
// stands alone), the lines after the first starting with indent.
func wrap(s string, width int, indent string) string {
	var b strings.Builder
	n := 0
	for i, w := range strings.Fields(s) {
		switch {
		case i == 0:
		case n+1+len([]rune(w)) > width:
			b.WriteString("\n" + indent)
			n = len([]rune(indent))
		default:
			b.WriteString(" ")
			n++
		}
		b.WriteString(w)
		n += len([]rune(w))
	}
	return b.String()
}

// renderHTML writes blocks as an HTML fragment.
func renderHTML(blocks []block) string {
	var b strings.Builder
	for _, bl := range blocks {
		switch bl.kind {
		case heading:
			fmt.Fprintf(&b, "<h%d>%s</h%d>\n", min(bl.level, 6), inlineHTML(bl.text), min(bl.level, 6))
		case paragraph:
			b.WriteString("<p>" + inlineHTML(bl.text) + "</p>\n")
		case list:
			b.WriteString("<ul>\n")
			for _, it := range bl.items {
				b.WriteString("<li>" + inlineHTML(it) + "</li>\n")
			}
			b.WriteString("</ul>\n")
		case code:
			b.WriteString("<pre><code>" + html.EscapeString(strings.Join(bl.code, "\n")) + "</code></pre>\n")
		case table:
			b.WriteString(htmlTable(bl.rows))
		}
	}
	return b.String()
}

func htmlTable(rows [][]string) string {
	var b strings.Builder
	b.WriteString("<table>\n")
	for i, r := range rows {
		cell := "td"
		if i == 0 {
			cell = "th"
		}
		b.WriteString("<tr>")
		for _, c := range r {
			fmt.Fprintf(&b, "<%s>%s</%s>", cell, inlineHTML(c), cell)
		}
		b.WriteString("</tr>\n")
	}
	b.WriteString("</table>\n")
	return b.String()
}
