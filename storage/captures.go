package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Capture is one request the agent received, byte-exact, and what became of
// it. Headers are kept as JSON arrays of [name, value] pairs, in order.
type Capture struct {
	Seq            int64
	ID             string
	RelayID        string // the relay's request id; empty for local captures
	Source         string // tunnel | replay | backfill | trigger
	CreatedAt      time.Time
	ArrivedAt      time.Time // at the relay; zero unless delivered late
	Late           bool      // came from the relay's offline queue
	Method         string
	Path           string
	Query          string
	RequestHeaders string // JSON
	Body           []byte
	Size           int // len(Body); set by List, which does not load bodies
	Target         string

	Event       string
	CallID      string
	DeliveryID  string
	OccurredAt  string
	DuplicateOf string
	ReplayOf    string

	Status          string // pending | delivered | failed
	ResponseStatus  int    // 0: no response
	ResponseHeaders string // JSON; "" when none
	ResponseBody    []byte
	Error           string
	Duration        time.Duration // -1: not finished
	DeliveredAt     time.Time
	Attempts        int
	MaxAttempts     int

	// LastAttempt, when set on an update, is recorded in the attempts log
	// in the same transaction.
	LastAttempt *Attempt

	// Redelivered is set by WriteCaptures when a capture with the same
	// RelayID was saved before: the relay sent a queued request again
	// because our ack was lost. The existing row is kept.
	Redelivered bool
}

// Capture status values.
const (
	StatusPending   = "pending"
	StatusDelivered = "delivered"
	StatusFailed    = "failed"
)

// maxIndexedBody keeps huge bodies out of the full-text index.
const maxIndexedBody = 1 << 20

func micros(t time.Time) sql.NullInt64 {
	if t.IsZero() {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: t.UnixMicro(), Valid: true}
}

func fromMicros(n sql.NullInt64) time.Time {
	if !n.Valid {
		return time.Time{}
	}
	return time.UnixMicro(n.Int64).UTC()
}

// WriteCaptures saves new captures and the responses of earlier ones in one
// transaction: the agent batches whatever arrived while the previous commit
// ran, so a burst costs one commit, not one per request. Statements are
// prepared once per batch, not parsed once per row.
func (db *DB) WriteCaptures(ctx context.Context, inserts, updates []*Capture) error {
	// Prepare before the transaction takes the only write connection.
	if err := db.prepareWrites(ctx); err != nil {
		return err
	}
	tx, err := db.write.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	w := captureWriter{db: db, ctx: ctx, tx: tx}
	defer w.close()
	for _, c := range inserts {
		if err := w.insert(c); err != nil {
			return err
		}
	}
	for _, c := range updates {
		if err := w.update(c); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// The writer's statements, prepared once on the write connection.
const (
	qSelRelay = `SELECT seq, id FROM captures WHERE relay_id = ?`
	qSelDup   = `SELECT id FROM captures WHERE delivery_id = ? ORDER BY seq LIMIT 1`
	qInsert   = `INSERT INTO captures (id, relay_id, source, created_at, arrived_at, late, method, path, query,
		request_headers, body, target, event, call_id, delivery_id, occurred_at, duplicate_of, replay_of, status, max_attempts)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	qFtsIns = `INSERT INTO captures_fts (docid, body) VALUES (?, ?)`
	qUpdate = `UPDATE captures SET status = ?, response_status = ?, response_headers = ?, response_body = ?,
		error = ?, duration_us = ?, delivered_at = ?, attempts = ?, max_attempts = ?, target = ? WHERE id = ?`
	qAttIns = `INSERT OR REPLACE INTO attempts (capture_id, n, at, response_status, error, duration_us) VALUES (?, ?, ?, ?, ?, ?)`
)

var writeQueries = []string{qSelRelay, qSelDup, qInsert, qFtsIns, qUpdate, qAttIns}

// captureWriter holds one batch's prepared statements, made on first use.
type captureWriter struct {
	db    *DB
	ctx   context.Context
	tx    *sql.Tx
	stmts map[string]*sql.Stmt
}

func (w *captureWriter) stmt(query string) (*sql.Stmt, error) {
	if st, ok := w.stmts[query]; ok {
		return st, nil
	}
	parent, ok := w.db.stmts[query]
	if !ok {
		return nil, fmt.Errorf("storage: statement not prepared: %.40s", query)
	}
	// On the single write connection the parent's statement is reused,
	// not prepared again: preparing costs more than the insert itself.
	st := w.tx.StmtContext(w.ctx, parent)
	if w.stmts == nil {
		w.stmts = map[string]*sql.Stmt{}
	}
	w.stmts[query] = st
	return st, nil
}

func (w *captureWriter) close() {
	for _, st := range w.stmts {
		st.Close()
	}
}

func (w *captureWriter) exec(query string, args ...any) (sql.Result, error) {
	st, err := w.stmt(query)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(w.ctx, args...)
}

func (w *captureWriter) queryRow(query string, args ...any) *sql.Row {
	st, err := w.stmt(query)
	if err != nil {
		return w.tx.QueryRowContext(w.ctx, query, args...) // reports the same error on Scan
	}
	return st.QueryRowContext(w.ctx, args...)
}

func (w *captureWriter) insert(c *Capture) error {
	if c.RelayID != "" {
		var id string
		var seq int64
		err := w.queryRow(qSelRelay, c.RelayID).Scan(&seq, &id)
		if err == nil {
			c.Seq, c.ID, c.Redelivered = seq, id, true
			return nil
		} else if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
	}
	if c.DeliveryID != "" && c.DuplicateOf == "" {
		err := w.queryRow(qSelDup, c.DeliveryID).Scan(&c.DuplicateOf)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
	}
	if c.Status == "" {
		c.Status = StatusPending
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 1
	}
	if c.RequestHeaders == "" {
		c.RequestHeaders = "[]"
	}
	if c.Body == nil {
		c.Body = []byte{}
	}
	res, err := w.exec(qInsert,
		c.ID, nullString(c.RelayID), c.Source, c.CreatedAt.UnixMicro(), micros(c.ArrivedAt), c.Late, c.Method, c.Path, c.Query,
		c.RequestHeaders, c.Body, c.Target, nullString(c.Event), nullString(c.CallID), nullString(c.DeliveryID), nullString(c.OccurredAt),
		nullString(c.DuplicateOf), nullString(c.ReplayOf), c.Status, c.MaxAttempts)
	if err != nil {
		return err
	}
	if c.Seq, err = res.LastInsertId(); err != nil {
		return err
	}
	if len(c.Body) > 0 && len(c.Body) <= maxIndexedBody && utf8.Valid(c.Body) {
		if _, err := w.exec(qFtsIns, c.Seq, string(c.Body)); err != nil {
			return err
		}
	}
	return nil
}

func (w *captureWriter) update(c *Capture) error {
	var status sql.NullInt64
	if c.ResponseStatus > 0 {
		status = sql.NullInt64{Int64: int64(c.ResponseStatus), Valid: true}
	}
	var dur sql.NullInt64
	if c.Duration >= 0 {
		dur = sql.NullInt64{Int64: c.Duration.Microseconds(), Valid: true}
	}
	_, err := w.exec(qUpdate,
		c.Status, status, nullString(c.ResponseHeaders), c.ResponseBody, nullString(c.Error), dur, micros(c.DeliveredAt),
		c.Attempts, c.MaxAttempts, c.Target, c.ID)
	if err != nil || c.LastAttempt == nil {
		return err
	}
	a := *c.LastAttempt
	var astatus sql.NullInt64
	if a.ResponseStatus > 0 {
		astatus = sql.NullInt64{Int64: int64(a.ResponseStatus), Valid: true}
	}
	_, err = w.exec(qAttIns,
		c.ID, a.N, a.At.UnixMicro(), astatus, nullString(a.Error), a.Duration.Microseconds())
	return err
}

const captureColumns = `seq, id, relay_id, source, created_at, arrived_at, late, method, path, query, request_headers,
	length(body), target, event, call_id, delivery_id, occurred_at, duplicate_of, replay_of, status, response_status,
	error, duration_us, delivered_at, attempts, max_attempts`

func scanCapture(sc interface{ Scan(...any) error }, extra ...any) (*Capture, error) {
	var (
		c                                                                       Capture
		relayID, event, callID, deliveryID, occurredAt, dupOf, replayOf, errTxt sql.NullString
		created                                                                 int64
		arrived, respStatus, dur, delivered                                     sql.NullInt64
	)
	dest := []any{&c.Seq, &c.ID, &relayID, &c.Source, &created, &arrived, &c.Late, &c.Method, &c.Path, &c.Query, &c.RequestHeaders,
		&c.Size, &c.Target, &event, &callID, &deliveryID, &occurredAt, &dupOf, &replayOf, &c.Status, &respStatus,
		&errTxt, &dur, &delivered, &c.Attempts, &c.MaxAttempts}
	if err := sc.Scan(append(dest, extra...)...); err != nil {
		return nil, err
	}
	c.RelayID, c.Event, c.CallID, c.DeliveryID, c.OccurredAt = relayID.String, event.String, callID.String, deliveryID.String, occurredAt.String
	c.DuplicateOf, c.ReplayOf, c.Error = dupOf.String, replayOf.String, errTxt.String
	c.CreatedAt = time.UnixMicro(created).UTC()
	c.ArrivedAt = fromMicros(arrived)
	c.ResponseStatus = int(respStatus.Int64)
	c.Duration = -1
	if dur.Valid {
		c.Duration = time.Duration(dur.Int64) * time.Microsecond
	}
	c.DeliveredAt = fromMicros(delivered)
	return &c, nil
}

// Capture loads one capture with its request and response bodies.
func (db *DB) Capture(ctx context.Context, id string) (*Capture, error) {
	var respHeaders sql.NullString
	var body, respBody []byte
	row := db.read.QueryRowContext(ctx, `SELECT `+captureColumns+`, body, response_headers, response_body FROM captures WHERE id = ?`, id)
	c, err := scanCapture(row, &body, &respHeaders, &respBody)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	} else if err != nil {
		return nil, err
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
	DeliveryID  string
	StatusClass string // 2xx 3xx 4xx 5xx none
	Text        string // full-text search in bodies
	Source      string
	ReplayOf    string
	Since       time.Time
	Until       time.Time
	Duplicate   *bool
	Page
}

func (f *CaptureFilter) where() (string, []any) {
	var conds []string
	var args []any
	add := func(cond string, a ...any) {
		conds = append(conds, cond)
		args = append(args, a...)
	}
	if f.Event != "" {
		add("event = ?", f.Event)
	}
	if f.CallID != "" {
		add("call_id = ?", f.CallID)
	}
	if f.DeliveryID != "" {
		add("delivery_id = ?", f.DeliveryID)
	}
	if f.Source != "" {
		add("source = ?", f.Source)
	}
	if f.ReplayOf != "" {
		add("replay_of = ?", f.ReplayOf)
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
	if q := ftsQuery(f.Text); q != "" {
		add("seq IN (SELECT docid FROM captures_fts WHERE captures_fts MATCH ?)", q)
	}
	if len(conds) == 0 {
		return "", nil
	}
	return " WHERE " + strings.Join(conds, " AND "), args
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

// Captures lists captures newest first, without bodies, and counts all that
// match the filter.
func (db *DB) Captures(ctx context.Context, f CaptureFilter) ([]*Capture, int, error) {
	where, args := f.where()
	var count int
	if err := db.read.QueryRowContext(ctx, `SELECT count(*) FROM captures`+where, args...).Scan(&count); err != nil {
		return nil, 0, err
	}
	rows, err := db.read.QueryContext(ctx, `SELECT `+captureColumns+` FROM captures`+where+` ORDER BY seq DESC LIMIT ? OFFSET ?`,
		append(args, f.Limit, f.Offset)...)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	out := make([]*Capture, 0, f.Limit)
	for rows.Next() {
		c, err := scanCapture(rows)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, c)
	}
	return out, count, rows.Err()
}

// Attempt is one try at delivering a capture to the local handler.
type Attempt struct {
	N              int
	At             time.Time
	ResponseStatus int
	Error          string
	Duration       time.Duration
}

// Attempts lists a capture's tries in order.
func (db *DB) Attempts(ctx context.Context, captureID string) ([]Attempt, error) {
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

// UndeliveredLate lists, oldest first, the captures that came from the
// relay's offline queue but were never sent to the handler: the agent
// stopped after saving them. The agent sends them on its next start.
func (db *DB) UndeliveredLate(ctx context.Context) ([]string, error) {
	rows, err := db.read.QueryContext(ctx, `SELECT id FROM captures WHERE late = 1 AND attempts = 0 ORDER BY seq`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}
