package agentdb

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/calltap/calltap/storage"
)

const captureColumns = `seq, id, relay_id, source, created_at, arrived_at, queued, method, path, query, request_headers,
	size, target, event, call_id, delivery_id, occurred_at, duplicate_of, replay_of, status, response_status,
	error, duration_us, delivered_at, attempts, max_attempts, keep, route`

// capturePrefixed is captureColumns qualified by the alias c, for joins.
var capturePrefixed = func() string {
	cols := strings.Split(captureColumns, ",")
	for i, col := range cols {
		cols[i] = "c." + strings.TrimSpace(col)
	}
	return strings.Join(cols, ", ")
}()

func scanCapture(sc interface{ Scan(...any) error }, extra ...any) (*Capture, error) {
	var (
		c                                                                              Capture
		relayID, event, callID, deliveryID, occurredAt, dupOf, replayOf, errTxt, route sql.NullString
		created                                                                        int64
		arrived, respStatus, dur, delivered                                            sql.NullInt64
	)
	dest := []any{&c.Seq, &c.ID, &relayID, &c.Source, &created, &arrived, &c.Queued, &c.Method, &c.Path, &c.Query, &c.RequestHeaders,
		&c.Size, &c.Target, &event, &callID, &deliveryID, &occurredAt, &dupOf, &replayOf, &c.Status, &respStatus,
		&errTxt, &dur, &delivered, &c.Attempts, &c.MaxAttempts, &c.Keep, &route}
	if err := sc.Scan(append(dest, extra...)...); err != nil {
		return nil, err
	}
	c.RelayID, c.Event, c.CallID, c.DeliveryID, c.OccurredAt = relayID.String, event.String, callID.String, deliveryID.String, occurredAt.String
	c.DuplicateOf, c.ReplayOf, c.Error, c.Route = dupOf.String, replayOf.String, errTxt.String, route.String
	c.CreatedAt = time.UnixMicro(created).UTC()
	c.ArrivedAt = storage.FromMicros(arrived)
	c.ResponseStatus = int(respStatus.Int64)
	c.Duration = -1
	if dur.Valid {
		c.Duration = time.Duration(dur.Int64) * time.Microsecond
	}
	c.DeliveredAt = storage.FromMicros(delivered)
	return &c, nil
}

// Capture loads one capture with its request and response bodies.
func (db *AgentStore) Capture(ctx context.Context, id string) (_ *Capture, err error) {
	defer db.explain(&err)
	if err := db.caughtUp(ctx); err != nil {
		return nil, err
	}
	c, err := db.scanFullCapture(db.read.QueryRowContext(ctx, `SELECT `+fullCaptureColumns+` FROM captures c
		LEFT JOIN capture_bodies b ON b.seq = c.seq WHERE c.id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	return c, err
}

// fullCaptureColumns is capturePrefixed and what a full capture adds: the
// request body (b, capture_bodies: in the row, or where in a segment) and
// the response. scanFullCapture reads a row of them.
var fullCaptureColumns = capturePrefixed + `, b.body, b.file, b.file_offset, c.response_headers, c.response_body`

// scanFullCapture reads a fullCaptureColumns row, and the request body from
// its segment when it is kept apart.
func (db *AgentStore) scanFullCapture(sc interface{ Scan(...any) error }) (*Capture, error) {
	var respHeaders sql.NullString
	var body, respBody []byte
	var file sql.NullString
	var offset sql.NullInt64
	c, err := scanCapture(sc, &body, &file, &offset, &respHeaders, &respBody)
	if err != nil {
		return nil, err
	}
	if file.Valid {
		if body, err = db.readFileBody(file.String, offset.Int64, int64(c.Size)); err != nil {
			return nil, err
		}
	}
	c.Body, c.ResponseHeaders, c.ResponseBody = body, respHeaders.String, respBody
	if c.Body == nil {
		c.Body = []byte{}
	}
	return c, nil
}

// CaptureFilter narrows a capture listing. Zero fields do not filter.
type CaptureFilter struct {
	Event       string
	CallID      string
	CallIDs     []string // any of these calls (export)
	DeliveryID  string
	IDPrefix    string // ids that start with it: a user's shortened capture id
	StatusClass string // 2xx 3xx 4xx 5xx none
	Text        string // full-text search in bodies
	Source      string
	ReplayOf    string
	Route       string // the route it took (inspector/routes)
	Since       time.Time
	Until       time.Time
	Duplicate   *bool
	Page
}

func (f *CaptureFilter) where() (string, []any) {
	conds, args := f.condsWithText()
	return joinWhere(conds), args
}

// condsWithText is conds and, for a text search, the match in the index.
func (f *CaptureFilter) condsWithText() ([]string, []any) {
	conds, args := f.conds()
	if q := ftsQuery(f.Text); q != "" {
		conds = append(conds, "seq IN (SELECT docid FROM search.captures_fts WHERE body MATCH ?)")
		args = append(args, q)
	}
	return conds, args
}

func joinWhere(conds []string) string {
	if len(conds) == 0 {
		return ""
	}
	return " WHERE " + strings.Join(conds, " AND ")
}

// conds is the filter's conditions on captures columns: all but Text.
func (f *CaptureFilter) conds() ([]string, []any) {
	var conds []string
	var args []any
	add := func(cond string, a ...any) {
		conds = append(conds, cond)
		args = append(args, a...)
	}
	for _, eq := range []struct{ col, val string }{
		{"event", f.Event}, {"call_id", f.CallID}, {"delivery_id", f.DeliveryID},
		{"source", f.Source}, {"replay_of", f.ReplayOf}, {"route", f.Route},
	} {
		if eq.val != "" {
			add(eq.col+" = ?", eq.val)
		}
	}
	if len(f.CallIDs) > 0 {
		marks := strings.Repeat("?, ", len(f.CallIDs))
		ids := make([]any, len(f.CallIDs))
		for i, id := range f.CallIDs {
			ids[i] = id
		}
		add("call_id IN ("+marks[:len(marks)-2]+")", ids...)
	}
	if f.IDPrefix != "" {
		// A range, not LIKE, so the unique index on id answers it. Ids
		// are ASCII, so every id with the prefix sorts below prefix+0x7f.
		add("id >= ? AND id < ?", f.IDPrefix, f.IDPrefix+"\x7f")
	}
	switch f.StatusClass {
	case "":
	case "none":
		add("response_status IS NULL")
	default:
		base := int(f.StatusClass[0]-'0') * 100
		add("response_status BETWEEN ? AND ?", base, base+99)
	}
	if !f.Since.IsZero() {
		add("created_at >= ?", f.Since.UnixMicro())
	}
	if !f.Until.IsZero() {
		add("created_at < ?", f.Until.UnixMicro())
	}
	if f.Duplicate != nil {
		if *f.Duplicate {
			add("duplicate_of IS NOT NULL")
		} else {
			add("duplicate_of IS NULL")
		}
	}
	return conds, args
}

// ftsQuery turns what a user typed into an FTS4 query that cannot be a
// syntax error: every word becomes a quoted phrase, all of which must match.
func ftsQuery(s string) string {
	var terms []string
	for _, w := range strings.Fields(s) {
		terms = append(terms, `"`+strings.ReplaceAll(w, `"`, `""`)+`"`)
	}
	return strings.Join(terms, " ")
}

// CapturesAfter returns up to limit captures that match f (its Page aside)
// and come after seq after, oldest first, bodies included: a walk that
// neither repeats nor misses a capture while new ones are saved.
func (db *AgentStore) CapturesAfter(ctx context.Context, f CaptureFilter, after int64, limit int) (_ []*Capture, err error) {
	defer db.explain(&err)
	if err := db.caughtUp(ctx); err != nil {
		return nil, err
	}
	if f.Text != "" {
		if err := db.CatchUpSearch(ctx); err != nil {
			return nil, err
		}
	}
	conds, args := f.condsWithText()
	conds = append(conds, "seq > ?")
	args = append(args, after, limit)
	// The page is chosen on captures alone, as a listing is (the filter's
	// columns are unqualified, and its plan is the listing's), and joined
	// to the bodies in the same statement: each capture is read once, from
	// one snapshot of the store.
	rows, err := db.read.QueryContext(ctx, `SELECT `+fullCaptureColumns+` FROM (SELECT * FROM captures`+joinWhere(conds)+` ORDER BY seq LIMIT ?) c
		LEFT JOIN capture_bodies b ON b.seq = c.seq ORDER BY c.seq`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]*Capture, 0, max(limit, 0))
	for rows.Next() {
		c, err := db.scanFullCapture(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// EachCapture calls fn with every capture f selects (its Page aside),
// oldest first and bodies included, reading a page at a time so that memory
// does not grow with the store; then returns how many it passed to fn.
func (db *AgentStore) EachCapture(ctx context.Context, f CaptureFilter, fn func(*Capture) error) (int, error) {
	if err := db.caughtUp(ctx); err != nil {
		return 0, err
	}
	const perPage = 200
	n := 0
	var after int64
	for {
		cs, err := db.CapturesAfter(ctx, f, after, perPage)
		if err != nil {
			return n, err
		}
		for _, c := range cs {
			if err := fn(c); err != nil {
				return n, err
			}
			after = c.Seq
			n++
		}
		if len(cs) < perPage {
			return n, nil
		}
	}
}

// listCaptures is Captures without the shortcuts of searchCaptures.
func (db *AgentStore) listCaptures(ctx context.Context, f CaptureFilter) ([]*Capture, int, error) {
	where, args := f.where()
	return db.listWhere(ctx, where, args, f.Page)
}

// listWhere lists a page of the captures matching where, newest first,
// and counts them all.
func (db *AgentStore) listWhere(ctx context.Context, where string, args []any, p Page) ([]*Capture, int, error) {
	var count int
	if err := db.read.QueryRowContext(ctx, `SELECT count(*) FROM captures`+where, args...).Scan(&count); err != nil {
		return nil, 0, err
	}
	rows, err := db.read.QueryContext(ctx, `SELECT `+captureColumns+` FROM captures`+where+` ORDER BY seq DESC LIMIT ? OFFSET ?`,
		append(args, p.Limit, p.Offset)...)
	if err != nil {
		return nil, 0, err
	}
	out, err := scanCaptures(rows, p.Limit)
	return out, count, err
}

// scanCaptures reads every row of a captureColumns query and closes rows.
func scanCaptures(rows *sql.Rows, capacity int) ([]*Capture, error) {
	defer rows.Close()
	out := make([]*Capture, 0, max(capacity, 0))
	for rows.Next() {
		c, err := scanCapture(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// Attempts lists a capture's tries in order.
func (db *AgentStore) Attempts(ctx context.Context, captureID string) (_ []Attempt, err error) {
	defer db.explain(&err)
	if err := db.caughtUp(ctx); err != nil {
		return nil, err
	}
	rows, err := db.read.QueryContext(ctx, `SELECT n, at, response_status, error, duration_us FROM attempts WHERE capture_id = ? ORDER BY n`, captureID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Attempt
	for rows.Next() {
		var a Attempt
		var at, dur int64
		var status sql.NullInt64
		var errTxt sql.NullString
		if err := rows.Scan(&a.N, &at, &status, &errTxt, &dur); err != nil {
			return nil, err
		}
		a.At, a.ResponseStatus, a.Error, a.Duration = time.UnixMicro(at).UTC(), int(status.Int64), errTxt.String, time.Duration(dur)*time.Microsecond
		out = append(out, a)
	}
	return out, rows.Err()
}

// Undelivered is a queued capture an earlier run saved but never sent.
type Undelivered struct {
	ID    string
	Route string // the route it took; its turn is in that route's line
}

// UndeliveredQueued lists, oldest first, the captures that came from the
// relay's offline queue but were never sent to the handler: the agent
// stopped after saving them. The agent sends them on its next start.
// Those stored only were never to be sent.
func (db *AgentStore) UndeliveredQueued(ctx context.Context) (_ []Undelivered, err error) {
	defer db.explain(&err)
	if err := db.caughtUp(ctx); err != nil {
		return nil, err
	}
	rows, err := db.read.QueryContext(ctx, `SELECT id, route FROM captures
		WHERE queued = 1 AND attempts = 0 AND status != '`+StatusStored+`' ORDER BY seq`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Undelivered
	for rows.Next() {
		var u Undelivered
		var route sql.NullString
		if err := rows.Scan(&u.ID, &route); err != nil {
			return nil, err
		}
		u.Route = route.String
		out = append(out, u)
	}
	return out, rows.Err()
}

// MarkInterrupted marks answer-unknown (StatusUnknown), with reason as
// their error, the live tunnel requests saved by an earlier run that never
// recorded the handler's answer: that run was killed (or could not record
// it) while they were at the handler or after, so their senders may have
// got the handler's answer, or a 5xx and then send them again. It returns
// how many it marked. Call it at start, before any new request is saved.
func (db *AgentStore) MarkInterrupted(ctx context.Context, reason string) (_ int64, err error) {
	defer db.explain(&err)
	if err := db.caughtUp(ctx); err != nil {
		return 0, err
	}
	// Versions before answer-unknown marked them failed, claiming the
	// sender was not given the answer: those are corrected too.
	res, err := db.write.ExecContext(ctx, `UPDATE captures SET status = ?, error = ?
		WHERE source = 'tunnel' AND queued = 0 AND attempts = 0
		AND (status = ? OR status = ? AND error LIKE 'interrupted: the agent stopped before the handler''s answer was recorded;%')`,
		StatusUnknown, reason, StatusPending, StatusFailed)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
