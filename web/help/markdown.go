package help

import (
	"strings"
)

// block is one block of a topic: a heading, a paragraph, a list, a code
// block or a table.
type block struct {
	kind  blockKind
	level int        // a heading's
	text  string     // a heading's or a paragraph's, inline Markdown
	items []string   // a list's items, inline Markdown
	code  []string   // a code block's lines, verbatim
	rows  [][]string // a table's rows (the first is its head), inline Markdown
}

type blockKind int

const (
	heading blockKind = iota
	paragraph
	list
	code
	table
)

// parse reads the Markdown the topics use into blocks. HTML comments on a
// line of their own (the README test's markers) are left out.
func parse(src string) []block {
	p := &parser{}
	for _, line := range strings.Split(strings.ReplaceAll(src, "\r\n", "\n"), "\n") {
		p.line(line)
	}
	p.flush()
	return p.out
}

// parser gathers lines into the block under way.
type parser struct {
	out    []block
	cur    *block
	inCode bool
}

func (p *parser) line(line string) {
	trimmed := strings.TrimSpace(line)
	switch {
	case p.inCode:
		if trimmed == "```" {
			p.inCode = false
			p.flush()
			return
		}
		p.cur.code = append(p.cur.code, line)
	case strings.HasPrefix(trimmed, "```"):
		p.flush()
		p.cur, p.inCode = &block{kind: code}, true
	case trimmed == "", strings.HasPrefix(trimmed, "<!--") && strings.HasSuffix(trimmed, "-->"):
		p.flush()
	case strings.HasPrefix(line, "#"):
		p.flush()
		level := len(line) - len(strings.TrimLeft(line, "#"))
		p.out = append(p.out, block{kind: heading, level: level, text: strings.TrimSpace(line[level:])})
	default:
		p.content(line, trimmed)
	}
}

// content adds a line of a table, a list or a paragraph.
func (p *parser) content(line, trimmed string) {
	switch {
	case strings.HasPrefix(trimmed, "|"):
		p.start(table)
		if cells := tableCells(trimmed); !separatorRow(cells) {
			p.cur.rows = append(p.cur.rows, cells)
		}
	case isItem(trimmed):
		p.start(list)
		p.cur.items = append(p.cur.items, itemText(trimmed))
	case p.cur != nil && p.cur.kind == list && strings.HasPrefix(line, "  "):
		last := len(p.cur.items) - 1
		p.cur.items[last] += " " + trimmed
	default:
		p.start(paragraph)
		if p.cur.text != "" {
			p.cur.text += " "
		}
		p.cur.text += trimmed
	}
}

// start makes the block under way one of kind, ending another.
func (p *parser) start(kind blockKind) {
	if p.cur != nil && p.cur.kind == kind {
		return
	}
	p.flush()
	p.cur = &block{kind: kind}
}

func (p *parser) flush() {
	if p.cur != nil {
		p.out = append(p.out, *p.cur)
	}
	p.cur = nil
}

func isItem(s string) bool {
	if strings.HasPrefix(s, "- ") {
		return true
	}
	n := len(s) - len(strings.TrimLeft(s, "0123456789"))
	return n > 0 && strings.HasPrefix(s[n:], ". ")
}

// itemText is a list item's text, its number kept ("1. …"), its dash not.
func itemText(s string) string {
	if strings.HasPrefix(s, "- ") {
		return s[2:]
	}
	return s
}

// tableCells splits a table row at the pipes that are not escaped (\|)
// nor inside inline code.
func tableCells(row string) []string {
	row = strings.TrimSuffix(strings.TrimPrefix(row, "|"), "|")
	var cells []string
	var cell strings.Builder
	inCode := false
	for i := 0; i < len(row); i++ {
		c := row[i]
		switch {
		case c == '\\' && i+1 < len(row) && row[i+1] == '|':
			cell.WriteByte('|')
			i++
		case c == '`':
			inCode = !inCode
			cell.WriteByte(c)
		case c == '|' && !inCode:
			cells = append(cells, strings.TrimSpace(cell.String()))
			cell.Reset()
		default:
			cell.WriteByte(c)
		}
	}
	return append(cells, strings.TrimSpace(cell.String()))
}

// separatorRow reports a table's |---|---| line.
func separatorRow(cells []string) bool {
	for _, c := range cells {
		if strings.Trim(c, "-: ") != "" {
			return false
		}
	}
	return true
}
