package inspector

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/relay"
	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/storage"
)

// An export is JSON Lines: a first line naming the format and its version,
// then one capture a line, oldest first, each the inspector API's detail of
// that capture (bodies as text, or base64 with body_encoding when they are
// not UTF-8).
const (
	ExportFormat  = "calltap-export"
	ExportVersion = 1
)

// ExportHeader is an export's first line.
type ExportHeader struct {
	Format     string `json:"format"`
	Version    int    `json:"version"`
	ExportedAt string `json:"exported_at"`
}

// exportEvery is how often an export reports its progress, in captures.
const exportEvery = 1000

// Export writes the captures f selects (its Page aside) to w as JSON Lines,
// oldest first, calling progress after each page with the count so far. It
// returns how many it wrote.
func Export(ctx context.Context, db *storage.AgentStore, f storage.CaptureFilter, w io.Writer, progress func(int)) (int, error) {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	if err := enc.Encode(ExportHeader{Format: ExportFormat, Version: ExportVersion, ExportedAt: api.FormatTime(time.Now())}); err != nil {
		return 0, err
	}
	n, err := eachCapture(ctx, db, f, progress, func(c *storage.Capture) error {
		attempts, err := db.Attempts(ctx, c.ID)
		if err != nil {
			return err
		}
		d := detailOf(c, attempts, nil)
		d.Checks = checksOf(c)
		return enc.Encode(d)
	})
	if err != nil {
		return n, err
	}
	return n, bw.Flush()
}

// eachCapture is the store's EachCapture, telling progress the count so
// far every exportEvery captures and at the end.
func eachCapture(ctx context.Context, db *storage.AgentStore, f storage.CaptureFilter, progress func(int), fn func(*storage.Capture) error) (int, error) {
	n := 0
	_, err := db.EachCapture(ctx, f, func(c *storage.Capture) error {
		if err := fn(c); err != nil {
			return err
		}
		n++
		if progress != nil && n%exportEvery == 0 {
			progress(n)
		}
		return nil
	})
	if progress != nil && n%exportEvery != 0 {
		progress(n)
	}
	return n, err
}

// ImportError is a line of an export that cannot be imported.
type ImportError struct {
	Line int
	Err  error
}

func (e *ImportError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }

// maxExportLine bounds one line of an export: the largest body calltap
// keeps, base64, with room for the rest.
const maxExportLine = 64 << 20

// ReadExport reads a whole export from r and returns its captures, marked
// as imported. Nothing is returned unless every line is good: the first bad
// one is an *ImportError naming it.
func ReadExport(r io.Reader) ([]*storage.Capture, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxExportLine)
	line := 0
	bad := func(format string, args ...any) error {
		return &ImportError{Line: line, Err: fmt.Errorf(format, args...)}
	}
	var out []*storage.Capture
	seen := map[string]int{} // id → the line that had it
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if line == 1 {
			var h ExportHeader
			if json.Unmarshal(b, &h) != nil || h.Format != ExportFormat {
				return nil, bad("not a calltap export (its first line names no format %q)", ExportFormat)
			}
			if h.Version > ExportVersion || h.Version < 1 {
				return nil, bad("export version %d; this calltap reads version %d (upgrade calltap)", h.Version, ExportVersion)
			}
			continue
		}
		if len(strings.TrimSpace(string(b))) == 0 {
			continue
		}
		var d Detail
		if err := json.Unmarshal(b, &d); err != nil {
			return nil, bad("not a capture: %v", err)
		}
		c, err := captureOf(&d)
		if err != nil {
			return nil, bad("%v", err)
		}
		// An export names each capture once; a repeat would otherwise
		// fail the whole import at the store, with no line to look at.
		if first, ok := seen[c.ID]; ok {
			return nil, bad("capture %s is already on line %d", c.ID, first)
		}
		seen[c.ID] = line
		out = append(out, c)
	}
	if err := sc.Err(); err != nil {
		return nil, bad("%v", err)
	}
	if line == 0 {
		return nil, errors.New("the file is empty: not a calltap export")
	}
	return out, nil
}

// captureOf turns an exported detail back into a capture, byte-exact.
func captureOf(d *Detail) (*storage.Capture, error) {
	if d.ID == "" {
		return nil, errors.New("a capture without an id")
	}
	body, err := decodeBody(d.Body, d.BodyEncoding)
	if err != nil {
		return nil, fmt.Errorf("body: %w", err)
	}
	respBody, err := decodeBody(d.ResponseBody, d.ResponseBodyEncoding)
	if err != nil {
		return nil, fmt.Errorf("response_body: %w", err)
	}
	c := &storage.Capture{
		ID: d.ID, Source: agent.SourceImport, Method: d.Method, Path: d.Path, Query: d.Query, Body: body,
		Target: d.Target, Status: d.Status, Error: d.Error, ReplayOf: d.ReplayOf, Queued: d.Queued,
		Attempts: d.Attempts, MaxAttempts: d.MaxAttempts, Duration: -1,
	}
	for _, t := range []struct {
		s    *string
		into *time.Time
		name string
	}{{d.CreatedAt, &c.CreatedAt, "created_at"}, {d.ArrivedAt, &c.ArrivedAt, "arrived_at"}, {d.DeliveredAt, &c.DeliveredAt, "delivered_at"}} {
		if t.s == nil {
			continue
		}
		if *t.into, err = time.Parse(time.RFC3339Nano, *t.s); err != nil {
			return nil, fmt.Errorf("%s: %v", t.name, err)
		}
	}
	if c.CreatedAt.IsZero() {
		return nil, errors.New("a capture without created_at")
	}
	hj, err := d.RequestHeaders.MarshalJSON()
	if err != nil {
		return nil, err
	}
	c.RequestHeaders = string(hj)
	if d.ResponseStatus != nil {
		c.ResponseStatus = *d.ResponseStatus
		rh, err := d.ResponseHeaders.MarshalJSON()
		if err != nil {
			return nil, err
		}
		c.ResponseHeaders, c.ResponseBody = string(rh), respBody
	}
	if d.DurationMS != nil {
		c.Duration = time.Duration(*d.DurationMS * float64(time.Millisecond)).Round(time.Microsecond)
	}
	agent.IndexCapture(c)
	return c, nil
}

func decodeBody(s, encoding string) ([]byte, error) {
	switch encoding {
	case "", "utf8":
		return []byte(s), nil
	case "base64":
		return base64.StdEncoding.DecodeString(s)
	}
	return nil, fmt.Errorf("unknown encoding %q", encoding)
}

// Import saves the captures of an export that the store does not hold yet
// (by id), in one transaction, and returns how many it added: importing the
// same export twice adds nothing.
func Import(ctx context.Context, db *storage.AgentStore, cs []*storage.Capture) (int, error) {
	var fresh, updates []*storage.Capture
	for _, c := range cs {
		if _, err := db.Capture(ctx, c.ID); err == nil {
			continue
		} else if !errors.Is(err, storage.ErrNotFound) {
			return 0, err
		}
		fresh = append(fresh, c)
		if c.ResponseStatus != 0 || c.Error != "" {
			u := *c
			updates = append(updates, &u)
		}
	}
	if len(fresh) == 0 {
		return 0, nil
	}
	if _, err := db.WriteCaptures(ctx, fresh, updates); err != nil {
		return 0, err
	}
	return len(fresh), nil
}

// HAR 1.2, as browsers' developer tools and HTTP tools read it. A body that
// is not UTF-8 is base64 with "encoding": "base64", in content as the
// specification has it and in postData as its readers accept.
type (
	harLog struct {
		Version string       `json:"version"`
		Creator harNameValue `json:"creator"`
		Entries []harEntry   `json:"entries"`
	}
	harNameValue struct {
		Name    string `json:"name"`
		Value   string `json:"value,omitempty"`
		Version string `json:"version,omitempty"`
	}
	harEntry struct {
		ID              string      `json:"_id"`
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
// entry at a time.
func ExportHAR(ctx context.Context, db *storage.AgentStore, f storage.CaptureFilter, version string, w io.Writer, progress func(int)) (int, error) {
	bw := bufio.NewWriter(w)
	head, err := json.Marshal(harLog{Version: "1.2", Creator: harNameValue{Name: "calltap", Version: version}})
	if err != nil {
		return 0, err
	}
	// The document up to its entries, then each entry as it is read.
	open := strings.TrimSuffix(string(head), `null}`)
	fmt.Fprintf(bw, `{"log":%s[`, open)
	sep := ""
	n, err := eachCapture(ctx, db, f, progress, func(c *storage.Capture) error {
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

func harEntryOf(c *storage.Capture) harEntry {
	var reqH, respH relay.Header
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
	e := harEntry{ID: c.ID, StartedDateTime: api.FormatTime(agent.Arrival(c)),
		Request: harRequest{Method: c.Method, URL: target, HTTPVersion: "HTTP/1.1", Cookies: []harNameValue{}, Headers: harHeaders(reqH),
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
		e.Request.QueryString = append(e.Request.QueryString, harNameValue{Name: k, Value: v})
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

func harHeaders(h relay.Header) []harNameValue {
	out := make([]harNameValue, len(h))
	for i, f := range h {
		out[i] = harNameValue{Name: f.Name, Value: f.Value}
	}
	return out
}

func harBodyOf(b []byte, mime string) harBody {
	text, enc := encodeBody(b)
	out := harBody{Size: int64(len(b)), MimeType: mime, Text: text}
	if enc == "base64" {
		out.Encoding = "base64"
	}
	return out
}
