package inspector

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/agentdb"
)

// HAR 1.2, as browsers' developer tools and HTTP tools read it. A body that
// is not UTF-8 is base64 with "encoding": "base64", in content as the
// specification has it and in postData as its readers accept.
type (
	harLog struct {
		Version string       `json:"version"`
		Creator harNameValue `json:"creator"`
		Comment string       `json:"comment,omitempty"` // what the export masked and redacted
		Entries []harEntry   `json:"entries"`           // last: written an entry at a time
	}
	harNameValue struct {
		Name     string `json:"name"`
		Value    string `json:"value,omitempty"`
		Version  string `json:"version,omitempty"`
		Encoding string `json:"_encoding,omitempty"` // base64: name and value are, for bytes that are not UTF-8
	}
	harEntry struct {
		ID              string      `json:"_id"`
		Route           string      `json:"_route,omitempty"` // the route it took (--routes)
		StartedDateTime string      `json:"startedDateTime"`
		Time            int64       `json:"time"`
		Request         harRequest  `json:"request"`
		Response        harResponse `json:"response"`
		Cache           struct{}    `json:"cache"`
		Timings         harTimings  `json:"timings"`
	}
	harRequest struct {
		Method      string         `json:"method"`
		URL         string         `json:"url"`
		HTTPVersion string         `json:"httpVersion"`
		Cookies     []harNameValue `json:"cookies"`
		Headers     []harNameValue `json:"headers"`
		QueryString []harNameValue `json:"queryString"`
		PostData    *harBody       `json:"postData,omitempty"`
		HeadersSize int64          `json:"headersSize"`
		BodySize    int64          `json:"bodySize"`
	}
	harResponse struct {
		Status      int            `json:"status"`
		StatusText  string         `json:"statusText"`
		HTTPVersion string         `json:"httpVersion"`
		Cookies     []harNameValue `json:"cookies"`
		Headers     []harNameValue `json:"headers"`
		Content     harBody        `json:"content"`
		RedirectURL string         `json:"redirectURL"`
		HeadersSize int64          `json:"headersSize"`
		BodySize    int64          `json:"bodySize"`
	}
	harBody struct {
		Size     int64  `json:"size"`
		MimeType string `json:"mimeType"`
		Text     string `json:"text"`
		Encoding string `json:"encoding,omitempty"`
	}
	harTimings struct {
		Send    int64 `json:"send"`
		Wait    int64 `json:"wait"`
		Receive int64 `json:"receive"`
	}
)

// ExportHAR writes what Export would as one HAR 1.2 document, streamed an
// entry at a time; the log's comment says what was masked and redacted.
func ExportHAR(ctx context.Context, db *agentdb.AgentStore, o ExportOptions, version string, w io.Writer) (int, error) {
	if err := o.learn(ctx, db); err != nil {
		return 0, err
	}
	bw := bufio.NewWriter(w)
	head, err := json.Marshal(harLog{Version: "1.2", Creator: harNameValue{Name: "calltap", Version: version}, Comment: o.header().comment()})
	if err != nil {
		return 0, err
	}
	// The document up to its entries, then each entry as it is read.
	open := strings.TrimSuffix(string(head), `null}`)
	fmt.Fprintf(bw, `{"log":%s[`, open)
	sep := ""
	n, err := eachCapture(ctx, db, o.Filter, o.Progress, func(c *agentdb.Capture) error {
		c, err := o.clean(c)
		if err != nil {
			return err
		}
		b, err := json.Marshal(harEntryOf(c))
		if err != nil {
			return err
		}
		bw.WriteString(sep)
		sep = ","
		_, err = bw.Write(b)
		return err
	})
	if err != nil {
		return n, err
	}
	bw.WriteString("]}}\n")
	return n, bw.Flush()
}

func harEntryOf(c *agentdb.Capture) harEntry {
	var reqH, respH wire.Header
	_ = reqH.UnmarshalJSON([]byte(c.RequestHeaders))
	if c.ResponseHeaders != "" {
		_ = respH.UnmarshalJSON([]byte(c.ResponseHeaders))
	}
	target := c.Target
	if target == "" {
		target = "http://" + reqH.Get("Host") + c.Path
		if c.Query != "" {
			target += "?" + c.Query
		}
	}
	e := harEntry{ID: c.ID, Route: c.Route, StartedDateTime: api.FormatTime(agent.Arrival(c)),
		Request: harRequest{Method: c.Method, URL: escapeInvalidUTF8(target), HTTPVersion: "HTTP/1.1", Cookies: []harNameValue{}, Headers: harHeaders(reqH),
			QueryString: []harNameValue{}, HeadersSize: -1, BodySize: int64(len(c.Body))},
		Response: harResponse{Status: c.ResponseStatus, HTTPVersion: "HTTP/1.1", Cookies: []harNameValue{}, Headers: harHeaders(respH),
			HeadersSize: -1, BodySize: int64(len(c.ResponseBody))},
	}
	for _, kv := range strings.Split(c.Query, "&") {
		if kv == "" {
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		k, _ = url.QueryUnescape(k)
		v, _ = url.QueryUnescape(v)
		e.Request.QueryString = append(e.Request.QueryString, harPair(k, v))
	}
	if c.Method != "GET" && c.Method != "HEAD" {
		b := harBodyOf(c.Body, reqH.Get("Content-Type"))
		e.Request.PostData = &b
	}
	e.Response.Content = harBodyOf(c.ResponseBody, respH.Get("Content-Type"))
	if c.ResponseStatus > 0 {
		e.Response.StatusText = http.StatusText(c.ResponseStatus)
	}
	if c.Duration > 0 {
		e.Time = c.Duration.Milliseconds()
		e.Timings.Wait = e.Time
	}
	return e
}

func harHeaders(h wire.Header) []harNameValue {
	out := make([]harNameValue, len(h))
	for i, f := range h {
		out[i] = harPair(f.Name, f.Value)
	}
	return out
}

// harPair is a header or query parameter, in base64 (and flagged) when its
// name or value is not UTF-8, as a body is.
func harPair(name, value string) harNameValue {
	if utf8.ValidString(name) && utf8.ValidString(value) {
		return harNameValue{Name: name, Value: value}
	}
	return harNameValue{Name: base64.StdEncoding.EncodeToString([]byte(name)), Value: base64.StdEncoding.EncodeToString([]byte(value)), Encoding: "base64"}
}

// comment is what an export's first line says, in words for a HAR.
func (h ExportHeader) comment() string {
	var parts []string
	if len(h.MaskedHeaders) > 0 {
		parts = append(parts, "the values of these headers are masked as "+MaskedValue+": "+strings.Join(h.MaskedHeaders, ", "))
	} else {
		parts = append(parts, "no header is masked: this export holds secrets")
	}
	if len(h.RedactedPaths) > 0 {
		parts = append(parts, "personal data is replaced by stand-ins at "+strings.Join(h.RedactedPaths, ", ")+", and wherever else those values appeared")
	}
	return "calltap export: " + strings.Join(parts, "; ")
}

func harBodyOf(b []byte, mime string) harBody {
	text, enc := encodeBody(b)
	out := harBody{Size: int64(len(b)), MimeType: mime, Text: text}
	if enc == "base64" {
		out.Encoding = "base64"
	}
	return out
}
