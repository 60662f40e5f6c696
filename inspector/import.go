package inspector

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

// ImportError is a line of an export that cannot be imported.
type ImportError struct {
	Line int
	Err  error
}

func (e *ImportError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }

// maxExportLine bounds one line of an export: the largest body calltap
// keeps, base64, with room for the rest.
const maxExportLine = 64 << 20

// Bounds of an imported capture's fields, each well beyond what calltap
// writes, so that a hand-made file cannot put what calltap would never
// hold into the store.
const (
	maxURIPart    = 1 << 20 // a path or a query: Go's server takes request lines of up to 1 MiB
	maxHeaders    = 1000
	maxHeaderText = 1 << 20 // names and values together
	maxErrorText  = 64 << 10
	maxAttempts   = 1000
	maxDuration   = 24 * time.Hour
	maxRouteName  = 1 << 10 // a route file sets no bound; names are words
)

// earliestCapture is before any capture calltap made; a time after now
// plus futureSlack is from a clock far off, or made up.
var earliestCapture = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

const futureSlack = 24 * time.Hour

// Imported is a capture read from an export, with its attempt log.
type Imported struct {
	*agentdb.Capture
	Attempts []agentdb.Attempt
}

// ExportFile is an export as read back.
type ExportFile struct {
	Header   ExportHeader
	Captures []Imported
}

// ReadExport reads a whole export from r and returns its captures, marked
// as imported. Every field is checked for the form and range calltap
// writes. Nothing is returned unless every line is good: the first bad
// one is an *ImportError naming it and the field.
func ReadExport(r io.Reader) (*ExportFile, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	line := 0
	bad := func(format string, args ...any) error {
		return &ImportError{Line: line, Err: fmt.Errorf(format, args...)}
	}
	out := &ExportFile{}
	seen := map[string]int{} // id → the line that had it
	for {
		b, err := readLine(br, maxExportLine)
		if err == io.EOF {
			break
		}
		line++
		if errors.Is(err, errLineTooLong) {
			return nil, fmt.Errorf("line %d is longer than %d MiB: not a calltap export, or damaged", line, maxExportLine>>20)
		}
		if err != nil {
			return nil, bad("%v", err)
		}
		if !utf8.Valid(b) {
			return nil, bad("not UTF-8 (at byte %d); calltap writes every line as UTF-8 JSON", invalidAt(b)+1)
		}
		if line == 1 {
			if err := readHeader(b, &out.Header); err != nil {
				return nil, bad("%v", err)
			}
			continue
		}
		if len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		var l exportLine
		if err := json.Unmarshal(b, &l); err != nil {
			return nil, bad("not a capture: %v", err)
		}
		c, err := importedOf(&l)
		if err != nil {
			return nil, bad("%v", err)
		}
		// An export names each capture once; a repeat would otherwise
		// fail the whole import at the store, with no line to look at.
		if first, ok := seen[c.ID]; ok {
			return nil, bad("capture %s is already on line %d", c.ID, first)
		}
		seen[c.ID] = line
		out.Captures = append(out.Captures, c)
	}
	if line == 0 {
		return nil, errors.New("the file is empty: not a calltap export")
	}
	return out, nil
}

// readHeader reads an export's first line into h: the format and a
// version this calltap reads.
func readHeader(b []byte, h *ExportHeader) error {
	if json.Unmarshal(b, h) != nil || h.Format != ExportFormat {
		return fmt.Errorf("not a calltap export (its first line names no format %q)", ExportFormat)
	}
	if h.Version > ExportVersion || h.Version < 1 {
		return fmt.Errorf("export version %d; this calltap reads version %d (upgrade calltap)", h.Version, ExportVersion)
	}
	return nil
}

var errLineTooLong = errors.New("line too long")

// readLine returns the next line of br without its newline, or
// errLineTooLong once it passes max bytes (without reading the rest).
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) > max+1 {
			return nil, errLineTooLong
		}
		line = append(line, chunk...)
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == io.EOF && len(line) > 0:
			return line, nil
		}
		return nil, err
	}
}

// invalidAt is the offset of the first byte of b that is not UTF-8.
func invalidAt(b []byte) int {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return len(b)
}

// quoteShort quotes s for a message, cut to a readable length.
func quoteShort(s string) string {
	if len(s) > 60 {
		return fmt.Sprintf("%q…", s[:60])
	}
	return fmt.Sprintf("%q", s)
}

// importedOf turns an exported line back into a capture, byte-exact,
// checking each field: who it is, its texts, its state, its times, its
// headers and answer, and its attempts, each a step of its own.
func importedOf(l *exportLine) (Imported, error) {
	d := &l.Detail
	if err := checkIdentity(d); err != nil {
		return Imported{}, err
	}
	t, err := decodeTexts(l)
	if err != nil {
		return Imported{}, err
	}
	if err := t.check(); err != nil {
		return Imported{}, err
	}
	if err := checkState(d); err != nil {
		return Imported{}, err
	}
	c := &agentdb.Capture{
		ID: d.ID, Source: agent.SourceImport, Method: d.Method, Path: t.path, Query: t.query, Body: t.body,
		Target: t.target, Route: d.Route, Status: d.Status, Error: t.err, ReplayOf: d.ReplayOf, Queued: d.Queued,
		Attempts: d.Attempts, MaxAttempts: d.MaxAttempts, Duration: -1,
	}
	for _, step := range []func(*Detail, *agentdb.Capture) error{captureTimes, requestHeaders, responseOf, durationOf} {
		if err := step(d, c); err != nil {
			return Imported{}, err
		}
	}
	if d.ResponseStatus != nil {
		c.ResponseBody = t.responseBody
	}
	attempts, err := attemptsOf(d.AttemptLog)
	if err != nil {
		return Imported{}, err
	}
	agent.IndexCapture(c)
	return Imported{Capture: c, Attempts: attempts}, nil
}

// checkIdentity checks the fields that name a capture and its method.
func checkIdentity(d *Detail) error {
	if !callevent.IsUUID(d.ID) {
		return fmt.Errorf("id: %s is not a capture id (a UUID, as calltap makes them)", quoteShort(d.ID))
	}
	if d.ReplayOf != "" && !callevent.IsUUID(d.ReplayOf) {
		return fmt.Errorf("replay_of: %s is not a capture id", quoteShort(d.ReplayOf))
	}
	if !isToken(d.Method) || len(d.Method) > 32 {
		return fmt.Errorf("method: %s is not an HTTP method", quoteShort(d.Method))
	}
	return nil
}

// importTexts are an exported line's text fields, decoded from the
// encoding each names.
type importTexts struct {
	body, responseBody       []byte
	path, query, target, err string
}

func decodeTexts(l *exportLine) (importTexts, error) {
	d := &l.Detail
	var t importTexts
	var body, responseBody string
	for _, f := range []struct {
		name, value, encoding string
		into                  *string
	}{
		{"body", d.Body, d.BodyEncoding, &body}, {"response_body", d.ResponseBody, d.ResponseBodyEncoding, &responseBody},
		{"path", d.Path, l.PathEncoding, &t.path}, {"query", d.Query, l.QueryEncoding, &t.query},
		{"target", d.Target, l.TargetEncoding, &t.target}, {"error", d.Error, l.ErrorEncoding, &t.err},
	} {
		b, err := decodeText(f.value, f.encoding)
		if err != nil {
			return t, fmt.Errorf("%s: %w", f.name, err)
		}
		*f.into = string(b)
	}
	t.body, t.responseBody = []byte(body), []byte(responseBody)
	return t, nil
}

// check checks the request line's parts and the error text for the form
// and size a capture can have.
func (t importTexts) check() error {
	switch {
	case !strings.HasPrefix(t.path, "/") || len(t.path) > maxURIPart || hasControl(t.path):
		return fmt.Errorf("path: %s is not a request path (a / first, no control characters, at most 1 MiB)", quoteShort(t.path))
	case len(t.query) > maxURIPart || hasControl(t.query):
		return fmt.Errorf("query: not a query (no control characters, at most 1 MiB)")
	case t.target != "" && !isTargetURL(t.target):
		return fmt.Errorf("target: %s is not an http(s) URL", quoteShort(t.target))
	case len(t.err) > maxErrorText:
		return fmt.Errorf("error: longer than %d KiB", maxErrorText>>10)
	}
	return nil
}

func isTargetURL(s string) bool {
	return (strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://")) && len(s) <= 2*maxURIPart && !hasControl(s)
}

// checkState checks the delivery state and the route that decided it, and
// fills what an older export leaves out (pending, one attempt allowed).
func checkState(d *Detail) error {
	switch d.Status {
	case "", agentdb.StatusPending, agentdb.StatusDelivered, agentdb.StatusFailed, agentdb.StatusUnknown, agentdb.StatusStored:
	default:
		return fmt.Errorf("status: %s is not pending, delivered, failed, unknown or stored", quoteShort(d.Status))
	}
	if !isRouteName(d.Route) {
		return fmt.Errorf("route: %s is not a route name (letters, digits, '.', '_' or '-', at most %d bytes)", quoteShort(d.Route), maxRouteName)
	}
	if d.Attempts < 0 || d.Attempts > maxAttempts || d.MaxAttempts < 0 || d.MaxAttempts > maxAttempts {
		return fmt.Errorf("attempts: %d of %d, want 0 to %d", d.Attempts, d.MaxAttempts, maxAttempts)
	}
	if d.Status == "" {
		d.Status = agentdb.StatusPending
	}
	if d.MaxAttempts == 0 {
		d.MaxAttempts = 1
	}
	return nil
}

// captureTimes reads the capture's times; created_at is required.
func captureTimes(d *Detail, c *agentdb.Capture) error {
	for _, t := range []struct {
		s    *string
		into *time.Time
		name string
	}{{d.CreatedAt, &c.CreatedAt, "created_at"}, {d.ArrivedAt, &c.ArrivedAt, "arrived_at"}, {d.DeliveredAt, &c.DeliveredAt, "delivered_at"}} {
		if t.s == nil {
			continue
		}
		var err error
		if *t.into, err = parseTime(*t.s); err != nil {
			return fmt.Errorf("%s: %v", t.name, err)
		}
	}
	if c.CreatedAt.IsZero() {
		return errors.New("created_at: missing")
	}
	return nil
}

func requestHeaders(d *Detail, c *agentdb.Capture) error {
	if err := checkHeaders(d.RequestHeaders); err != nil {
		return fmt.Errorf("request_headers: %w", err)
	}
	hj, err := d.RequestHeaders.MarshalJSON()
	if err != nil {
		return err
	}
	c.RequestHeaders = string(hj)
	return nil
}

// responseOf reads the handler's answer, when the capture has one.
func responseOf(d *Detail, c *agentdb.Capture) error {
	if d.ResponseStatus == nil {
		return nil
	}
	if *d.ResponseStatus < 100 || *d.ResponseStatus > 599 {
		return fmt.Errorf("response_status: %d is not an HTTP status (100 to 599)", *d.ResponseStatus)
	}
	if err := checkHeaders(d.ResponseHeaders); err != nil {
		return fmt.Errorf("response_headers: %w", err)
	}
	rh, err := d.ResponseHeaders.MarshalJSON()
	if err != nil {
		return err
	}
	c.ResponseStatus, c.ResponseHeaders = *d.ResponseStatus, string(rh)
	return nil
}

func durationOf(d *Detail, c *agentdb.Capture) error {
	if d.DurationMS == nil {
		return nil
	}
	var err error
	if c.Duration, err = parseDuration(*d.DurationMS); err != nil {
		return fmt.Errorf("duration_ms: %v", err)
	}
	return nil
}

func attemptsOf(log []AttemptJSON) ([]agentdb.Attempt, error) {
	if len(log) > maxAttempts {
		return nil, fmt.Errorf("attempt_log: %d attempts, at most %d", len(log), maxAttempts)
	}
	var attempts []agentdb.Attempt
	for i, aj := range log {
		a, err := attemptOf(aj, i)
		if err != nil {
			return nil, fmt.Errorf("attempt_log[%d]: %w", i, err)
		}
		attempts = append(attempts, a)
	}
	return attempts, nil
}

func attemptOf(aj AttemptJSON, i int) (agentdb.Attempt, error) {
	if aj.N != i+1 {
		return agentdb.Attempt{}, fmt.Errorf("n: %d, want %d (attempts are numbered from 1, in order)", aj.N, i+1)
	}
	a := agentdb.Attempt{N: aj.N, Error: aj.Error}
	if aj.At == nil {
		return a, errors.New("at: missing")
	}
	var err error
	if a.At, err = parseTime(*aj.At); err != nil {
		return a, fmt.Errorf("at: %v", err)
	}
	if aj.ResponseStatus != nil {
		if *aj.ResponseStatus < 100 || *aj.ResponseStatus > 599 {
			return a, fmt.Errorf("response_status: %d is not an HTTP status (100 to 599)", *aj.ResponseStatus)
		}
		a.ResponseStatus = *aj.ResponseStatus
	}
	if len(aj.Error) > maxErrorText {
		return a, fmt.Errorf("error: longer than %d KiB", maxErrorText>>10)
	}
	if a.Duration, err = parseDuration(aj.DurationMS); err != nil {
		return a, fmt.Errorf("duration_ms: %v", err)
	}
	return a, nil
}

// parseTime reads a time as calltap writes it, in the window a capture
// can have been made.
func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return t, fmt.Errorf("%s is not an RFC 3339 time", quoteShort(s))
	}
	if t.Before(earliestCapture) || t.After(time.Now().Add(futureSlack)) {
		return t, fmt.Errorf("%s is outside %s to a day from now", s, earliestCapture.Format(time.DateOnly))
	}
	return t.UTC().Truncate(time.Microsecond), nil // what the store keeps
}

func parseDuration(ms float64) (time.Duration, error) {
	if !(ms >= 0 && ms <= float64(maxDuration/time.Millisecond)) {
		return 0, fmt.Errorf("%g is not 0 to %d ms", ms, maxDuration/time.Millisecond)
	}
	return time.Duration(ms * float64(time.Millisecond)).Round(time.Microsecond), nil
}

// checkHeaders checks names are HTTP tokens and values hold no line break
// or NUL, as a request on the wire can have them.
func checkHeaders(h wire.Header) error {
	if len(h) > maxHeaders {
		return fmt.Errorf("%d fields, at most %d", len(h), maxHeaders)
	}
	size := 0
	for i, f := range h {
		size += len(f.Name) + len(f.Value)
		if !isToken(f.Name) {
			return fmt.Errorf("field %d: %s is not a header name", i+1, quoteShort(f.Name))
		}
		if strings.ContainsAny(f.Value, "\r\n\x00") {
			return fmt.Errorf("field %d (%s): the value has a line break or NUL", i+1, f.Name)
		}
	}
	if size > maxHeaderText {
		return fmt.Errorf("%d bytes, at most %d", size, maxHeaderText)
	}
	return nil
}

// isToken reports whether s is an HTTP token (RFC 9110 section 5.6.2).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// isRouteName reports whether s is empty (no route decided) or a name a
// route file allows, which "default" and "filtered" are too: the names
// the agent records.
func isRouteName(s string) bool {
	const allowed = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
	return len(s) <= maxRouteName && strings.Trim(s, allowed) == ""
}

func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return true
		}
	}
	return false
}

// decodeText is a field as exported: as it is, or base64.
func decodeText(s, encoding string) ([]byte, error) {
	switch encoding {
	case "", "utf8":
		return []byte(s), nil
	case "base64":
		return base64.StdEncoding.DecodeString(s)
	}
	return nil, fmt.Errorf("unknown encoding %s", quoteShort(encoding))
}

// Import saves the captures of an export that the store does not hold yet
// (by id), with their answers and attempt logs, in one transaction, and
// returns how many it added: importing the same export twice adds nothing.
func Import(ctx context.Context, db *agentdb.AgentStore, cs []Imported) (int, error) {
	var fresh, updates []*agentdb.Capture
	for _, c := range cs {
		if _, err := db.Capture(ctx, c.ID); err == nil {
			continue
		} else if !errors.Is(err, storage.ErrNotFound) {
			return 0, err
		}
		fresh = append(fresh, c.Capture)
		// The answer, then each attempt of the log as an update of its
		// own: the store records one attempt per update.
		u := *c.Capture
		updates = append(updates, &u)
		for i := range c.Attempts {
			u := *c.Capture
			u.LastAttempt = &c.Attempts[i]
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
