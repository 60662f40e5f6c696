package agentdb

import (
	"context"
	"database/sql"
	"strings"
	"time"
)

// CallRow is one call in a listing: the captures that share a call_id.
type CallRow struct {
	CallID   string
	Captures int       // captures of the call, duplicates included
	FirstAt  time.Time // created_at of its first capture
	LastAt   time.Time // created_at of its newest capture
	LastSeq  int64     // seq of its newest capture: the listing's order
}

// CallFilter narrows a call listing. Zero fields do not filter; a call
// matches when any of its captures does.
type CallFilter struct {
	Event       string // has an event of this kind
	OutcomeCode string // has a capture whose call.outcome_code is this
	All         bool   // ignore Page: every matching call (for filters applied after analysis)
	Page
}

func (f *CallFilter) where() (string, []any) {
	conds := []string{"call_id IS NOT NULL", "call_id != ''"}
	var args []any
	if f.Event != "" {
		conds = append(conds, "call_id IN (SELECT call_id FROM captures WHERE event = ? AND call_id IS NOT NULL)")
		args = append(args, f.Event)
	}
	if f.OutcomeCode != "" {
		// outcome_code is not a column: read it from the bodies of the
		// call's captures. Bodies are BLOBs, which SQLite's JSON functions
		// would take for JSONB, hence the cast; json_valid keeps a body
		// that is not JSON from failing the whole query. Bodies kept in
		// segment files (256 KiB and more) are not read: call events are small.
		conds = append(conds, `call_id IN (SELECT c.call_id FROM captures c JOIN capture_bodies b ON b.seq = c.seq
			WHERE c.call_id IS NOT NULL AND c.event IS NOT NULL
			AND json_valid(CAST(b.body AS TEXT)) AND json_extract(CAST(b.body AS TEXT), '$.call.outcome_code') = ?)`)
		args = append(args, f.OutcomeCode)
	}
	return " WHERE " + strings.Join(conds, " AND "), args
}

// Calls lists calls, newest activity first, and counts all that match.
func (db *AgentStore) Calls(ctx context.Context, f CallFilter) (_ []CallRow, _ int, err error) {
	defer db.explain(&err)
	if err := db.caughtUp(ctx); err != nil {
		return nil, 0, err
	}
	where, args := f.where()
	var count int
	if err := db.read.QueryRowContext(ctx, `SELECT count(DISTINCT call_id) FROM captures`+where, args...).Scan(&count); err != nil {
		return nil, 0, err
	}
	q := `SELECT call_id, count(*), min(created_at), max(created_at), max(seq) FROM captures` + where +
		` GROUP BY call_id ORDER BY max(seq) DESC`
	if !f.All {
		q += ` LIMIT ? OFFSET ?`
		args = append(args, f.Limit, f.Offset)
	}
	rows, err := db.read.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var out []CallRow
	for rows.Next() {
		var r CallRow
		var first, last int64
		if err := rows.Scan(&r.CallID, &r.Captures, &first, &last, &r.LastSeq); err != nil {
			return nil, 0, err
		}
		r.FirstAt, r.LastAt = time.UnixMicro(first).UTC(), time.UnixMicro(last).UTC()
		out = append(out, r)
	}
	return out, count, rows.Err()
}

// callBatch bounds the number of parameters of one IN list (SQLite's
// default limit is 32766; staying far below it keeps each query cheap).
const callBatch = 500

// CallCaptures loads the captures of the given calls, bodies included, each
// call's in insertion order. Calls without captures are absent from the map.
func (db *AgentStore) CallCaptures(ctx context.Context, callIDs ...string) (_ map[string][]*Capture, err error) {
	defer db.explain(&err)
	if err := db.caughtUp(ctx); err != nil {
		return nil, err
	}
	out := make(map[string][]*Capture, len(callIDs))
	for start := 0; start < len(callIDs); start += callBatch {
		batch := callIDs[start:min(start+callBatch, len(callIDs))]
		args := make([]any, len(batch))
		for i, id := range batch {
			args[i] = id
		}
		marks := strings.TrimSuffix(strings.Repeat("?,", len(batch)), ",")
		rows, err := db.read.QueryContext(ctx, `SELECT `+capturePrefixed+`, b.body, b.file, b.file_offset
			FROM captures c LEFT JOIN capture_bodies b ON b.seq = c.seq WHERE c.call_id IN (`+marks+`) ORDER BY c.seq`, args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var body []byte
			var file sql.NullString
			var offset sql.NullInt64
			c, err := scanCapture(rows, &body, &file, &offset)
			if err == nil && file.Valid {
				body, err = db.readFileBody(file.String, offset.Int64, int64(c.Size))
			}
			if err != nil {
				rows.Close()
				return nil, err
			}
			c.Body = body
			if c.Body == nil {
				c.Body = []byte{}
			}
			out[c.CallID] = append(out[c.CallID], c)
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// CallBodies are the request bodies of a call's first captures (at most
// limit), oldest first, as applied to the database: it does not wait for
// the intake log's latest records, which the caller (the agent's memory
// of calls, on the capture path) has seen itself. Large bodies are read
// from their segments.
func (db *AgentStore) CallBodies(ctx context.Context, callID string, limit int) (_ [][]byte, err error) {
	defer db.explain(&err)
	rows, err := db.read.QueryContext(ctx, `SELECT c.size, b.body, b.file, b.file_offset
		FROM captures c JOIN capture_bodies b ON b.seq = c.seq WHERE c.call_id = ? ORDER BY c.seq LIMIT ?`, callID, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var bodies [][]byte
	for rows.Next() {
		var size int64
		var body []byte
		var file sql.NullString
		var offset sql.NullInt64
		if err := rows.Scan(&size, &body, &file, &offset); err != nil {
			return nil, err
		}
		if file.Valid {
			if body, err = db.readFileBody(file.String, offset.Int64, size); err != nil {
				return nil, err
			}
		}
		bodies = append(bodies, body)
	}
	return bodies, rows.Err()
}
