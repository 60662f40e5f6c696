// Package help is calltap's reference: one Markdown text per topic, kept
// in topics/ beside this file and embedded in the binary, so that it is
// versioned with the code and there wherever the binary is. `calltap help
// TOPIC` prints a topic as plain text (Text); the inspector's Help serves
// it as HTML (HTML), escaped.
//
// A topic file starts with its title line, "# NAME: what it covers", whose
// words after the colon are the topic's one line in `calltap help`. The
// Markdown is the small part of it the texts use: headings, paragraphs,
// lists, fenced code, tables, and inline code, bold and links.
package help

import (
	"embed"
	"io/fs"
	"path"
	"sort"
	"strings"
)

//go:embed topics/*.md
var topicsFS embed.FS

// Topic is one text of the reference.
type Topic struct {
	Name    string // as `calltap help NAME` takes it
	Summary string // one line
}

// Topics lists the topics, by name.
func Topics() []Topic {
	entries, err := fs.ReadDir(topicsFS, "topics")
	if err != nil {
		// The files are compiled in: failing to read them is a build defect.
		panic("help: reading embedded topics: " + err.Error())
	}
	var out []Topic
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), ".md")
		src, _ := Markdown(name)
		out = append(out, Topic{Name: name, Summary: summary(src)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Names is the topics' names, by name.
func Names() []string {
	var names []string
	for _, t := range Topics() {
		names = append(names, t.Name)
	}
	return names
}

// Markdown is a topic's source; false for no such topic.
func Markdown(name string) (string, bool) {
	if name == "" || strings.ContainsAny(name, "/\\.") {
		return "", false
	}
	b, err := topicsFS.ReadFile(path.Join("topics", name+".md"))
	if err != nil {
		return "", false
	}
	return string(b), true
}

// summary is the words after the colon of a topic's title line.
func summary(src string) string {
	first, _, _ := strings.Cut(src, "\n")
	_, s, _ := strings.Cut(first, ": ")
	return strings.TrimSpace(s)
}

// Text is a topic as plain text for a terminal; false for no such topic.
func Text(name string) (string, bool) {
	src, ok := Markdown(name)
	if !ok {
		return "", false
	}
	return renderText(parse(src)), true
}

// HTML is a topic as an HTML fragment, every character of the text
// escaped; false for no such topic.
func HTML(name string) (string, bool) {
	src, ok := Markdown(name)
	if !ok {
		return "", false
	}
	return renderHTML(parse(src)), true
}
