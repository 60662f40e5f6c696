package web

import (
	"html"
	"net/http"
	"strconv"
	"strings"

	"github.com/calltap/calltap/web/help"
)

// serveHelp serves the reference (web/help) as pages of their own: /help/
// lists the topics, /help/NAME is one, rendered from its Markdown with
// every character of the text escaped. They are plain pages, under the
// same Content-Security-Policy as the UI, that need no script.
func serveHelp(w http.ResponseWriter, r *http.Request, name string) {
	if name == "" {
		writeHelpPage(w, http.StatusOK, "calltap help", topicList())
		return
	}
	body, ok := help.HTML(name)
	if !ok {
		writeHelpPage(w, http.StatusNotFound, "calltap help",
			"<p>No topic "+html.EscapeString(strconv.Quote(name))+". The topics:</p>\n"+topicList())
		return
	}
	writeHelpPage(w, http.StatusOK, "calltap help "+name, body)
}

// topicList is the topics as a list of links, each with its line.
func topicList() string {
	var b strings.Builder
	b.WriteString("<ul class=\"help-topics\">\n")
	for _, t := range help.Topics() {
		n := html.EscapeString(t.Name)
		b.WriteString(`<li><a href="/help/` + n + `">` + n + `</a>: ` + html.EscapeString(t.Summary) + "</li>\n")
	}
	b.WriteString("</ul>\n")
	return b.String()
}

func writeHelpPage(w http.ResponseWriter, status int, title, body string) {
	page := "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n" +
		"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<meta name=\"color-scheme\" content=\"light dark\">\n" +
		"<title>" + html.EscapeString(title) + "</title>\n<link rel=\"icon\" href=\"/static/favicon.svg\" type=\"image/svg+xml\">\n" +
		"<link rel=\"stylesheet\" href=\"/static/app.css\">\n</head>\n<body class=\"help-page\">\n" +
		"<header class=\"topbar\"><a href=\"/\" class=\"brand\"><span>calltap</span></a><nav class=\"views\">" +
		"<a href=\"/\" class=\"navlink\">Requests</a><a href=\"/calls\" class=\"navlink\">Calls</a><a href=\"/help/\" class=\"navlink on\">Help</a></nav></header>\n" +
		"<main class=\"help\">\n" + body + "</main>\n</body>\n</html>\n"
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(status)
	w.Write([]byte(page))
}
