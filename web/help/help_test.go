package help

import (
	"strings"
	"testing"
)

// A topic's text is escaped in HTML whatever it holds, in prose, code,
// tables and links; a link goes only to the web, a place in the page or
// another topic.
func TestHTMLEscapes(t *testing.T) {
	src := "# x: y\n\nA <script>alert(1)</script> & `<b>` **<i>**\n\n" +
		"- item <img src=x onerror=alert(1)>\n\n```sh\necho '<tunnel-id>'\n```\n\n" +
		"| a | b |\n|---|---|\n| `x\\|y` | <u>z</u> |\n\n" +
		"[ok](https://example.com/a?b=<c>) [bad](javascript:alert(1)) [topic](help:data)\n"
	got := renderHTML(parse(src))
	for _, bad := range []string{"<script", "<img", "<u>", "<b>", "<i>", "javascript:"} {
		if strings.Contains(got, bad) {
			t.Errorf("HTML holds %q:\n%s", bad, got)
		}
	}
	for _, want := range []string{"&lt;script&gt;", "<code>&lt;b&gt;</code>", "<strong>&lt;i&gt;</strong>", "<li>item &lt;img",
		"<pre><code>echo &#39;&lt;tunnel-id&gt;&#39;</code></pre>", "<td><code>x|y</code></td>",
		`<a href="https://example.com/a?b=&lt;c&gt;">ok</a>`, `<a href="/help/data">topic</a>`, "bad"} {
		if !strings.Contains(got, want) {
			t.Errorf("HTML lacks %q:\n%s", want, got)
		}
	}
}

// As plain text, the Markdown's marks are gone, code is indented, tables
// are columns and a link's target follows it.
func TestText(t *testing.T) {
	got := renderText(parse("# t: s\n\nSee **this** and `that`, [here](https://x.example).\n\n```\ncode\n```\n\n| a | bb |\n|---|---|\n| ccc | d |\n"))
	for _, want := range []string{"t: s\n====", "See this and that, here (https://x.example).", "    code", "a    bb\nccc  d"} {
		if !strings.Contains(got, want) {
			t.Errorf("text lacks %q:\n%s", want, got)
		}
	}
}

// Every topic has a title line with its summary, and no name outside
// topics/ reads as one.
func TestTopics(t *testing.T) {
	for _, tp := range Topics() {
		if tp.Summary == "" {
			t.Errorf("topic %s has no summary in its title line", tp.Name)
		}
		if _, ok := HTML(tp.Name); !ok {
			t.Errorf("topic %s does not render", tp.Name)
		}
	}
	for _, bad := range []string{"", "../README", "topics/data", "data.md", "nope"} {
		if _, ok := Markdown(bad); ok {
			t.Errorf("%q reads as a topic", bad)
		}
	}
}
