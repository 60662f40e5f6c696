// Package mediafile is the media_files table of an agent store: a row for
// each recording or transcript the agent downloads from a signed link
// before it expires (section 6.6 of the service's documentation), with
// where the download stands and, once saved, the file's name, size and
// digest. The files themselves are in the store's media folder
// (agentdb.MediaDir); storage/agentdb opens the store and serves these
// statements as its methods (ClaimMedia, UpdateMedia, Media, MediaFiles).
package mediafile

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/calltap/calltap/storage"
)

// File is a recording or transcript downloaded from a signed link.
type File struct {
	Seq         int64
	ID          string
	CaptureID   string // capture whose payload carried the link; "" for `calltap media`
	CallID      string
	Kind        string // Recording | Transcript
	SourceURL   string
	ExpiresAt   time.Time // zero when unknown
	Status      string    // Pending | Saved | Failed
	Attempts    int
	Error       string
	File        string // name inside the media folder, once saved
	Size        int64
	ContentType string
	SHA256      string
	CreatedAt   time.Time
	UpdatedAt   time.Time
	SavedAt     time.Time
}

// Kinds and statuses.
const (
	Recording  = "recording"
	Transcript = "transcript"

	Pending = "pending" // queued or downloading; Attempts and Error tell how it goes
	Saved   = "saved"
	Failed  = "failed" // gave up
)

// Claim records a link to download, on db (the store's write pool). When
// the same link of the same kind is already recorded (a duplicate delivery
// carries the same links), it returns that row and start=false, unless
// that row failed: then the row is reset to pending and returned with
// start=true, so the caller tries again. A new row gets f's fields and
// start=true.
func Claim(ctx context.Context, db *sql.DB, f *File) (row *File, start bool, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, false, err
	}
	defer tx.Rollback()
	existing, err := scan(tx.QueryRowContext(ctx, `SELECT `+columns+` FROM media_files WHERE source_url = ? AND kind = ? ORDER BY seq DESC LIMIT 1`, f.SourceURL, f.Kind))
	switch {
	case err == nil && existing.Status != Failed:
		return existing, false, nil
	case err == nil:
		existing.Status, existing.Error, existing.UpdatedAt = Pending, "", f.CreatedAt
		if _, err := tx.ExecContext(ctx, `UPDATE media_files SET status = ?, error = NULL, updated_at = ? WHERE id = ?`,
			existing.Status, existing.UpdatedAt.UnixMicro(), existing.ID); err != nil {
			return nil, false, err
		}
		return existing, true, tx.Commit()
	case !errors.Is(err, sql.ErrNoRows):
		return nil, false, err
	}
	if f.Status == "" {
		f.Status = Pending
	}
	f.UpdatedAt = f.CreatedAt
	res, err := tx.ExecContext(ctx, `INSERT INTO media_files (id, capture_id, call_id, kind, source_url, expires_at, status, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		f.ID, f.CaptureID, f.CallID, f.Kind, f.SourceURL, storage.Micros(f.ExpiresAt), f.Status, f.CreatedAt.UnixMicro(), f.UpdatedAt.UnixMicro())
	if err != nil {
		return nil, false, err
	}
	if f.Seq, err = res.LastInsertId(); err != nil {
		return nil, false, err
	}
	return f, true, tx.Commit()
}

// Update records the progress of a download, on db (the store's write
// pool).
func Update(ctx context.Context, db *sql.DB, f *File) error {
	var size sql.NullInt64
	if f.Status == Saved {
		size = sql.NullInt64{Int64: f.Size, Valid: true}
	}
	_, err := db.ExecContext(ctx, `UPDATE media_files SET status = ?, attempts = ?, error = ?, file = ?, size = ?, content_type = ?,
		sha256 = ?, updated_at = ?, saved_at = ? WHERE id = ?`,
		f.Status, f.Attempts, nullString(f.Error), nullString(f.File), size, nullString(f.ContentType), nullString(f.SHA256),
		f.UpdatedAt.UnixMicro(), storage.Micros(f.SavedAt), f.ID)
	return err
}

func nullString(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }

const columns = `seq, id, capture_id, call_id, kind, source_url, expires_at, status, attempts, error, file, size, content_type,
	sha256, created_at, updated_at, saved_at`

func scan(sc interface{ Scan(...any) error }) (*File, error) {
	var (
		f                        File
		errTxt, file, ctype, sum sql.NullString
		expires, size, saved     sql.NullInt64
		created, updated         int64
	)
	if err := sc.Scan(&f.Seq, &f.ID, &f.CaptureID, &f.CallID, &f.Kind, &f.SourceURL, &expires, &f.Status, &f.Attempts, &errTxt,
		&file, &size, &ctype, &sum, &created, &updated, &saved); err != nil {
		return nil, err
	}
	f.ExpiresAt, f.SavedAt = storage.FromMicros(expires), storage.FromMicros(saved)
	f.Error, f.File, f.ContentType, f.SHA256, f.Size = errTxt.String, file.String, ctype.String, sum.String, size.Int64
	f.CreatedAt, f.UpdatedAt = time.UnixMicro(created).UTC(), time.UnixMicro(updated).UTC()
	return &f, nil
}

// Get loads one media file record from db (a read pool); storage.ErrNotFound
// when there is none.
func Get(ctx context.Context, db *sql.DB, id string) (*File, error) {
	f, err := scan(db.QueryRowContext(ctx, `SELECT `+columns+` FROM media_files WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, storage.ErrNotFound
	}
	return f, err
}

// Filter narrows a media listing. Zero fields do not filter; a zero Limit
// lists every match.
type Filter struct {
	CallID    string
	CaptureID string
	SourceURL string
	Kind      string
	Status    string
	storage.Page
}

// where is the filter's WHERE clause and its arguments.
func (f Filter) where() (string, []any) {
	var conds []string
	var args []any
	for _, c := range []struct{ col, v string }{
		{"call_id", f.CallID}, {"capture_id", f.CaptureID}, {"source_url", f.SourceURL}, {"kind", f.Kind}, {"status", f.Status},
	} {
		if c.v != "" {
			conds = append(conds, c.col+" = ?")
			args = append(args, c.v)
		}
	}
	if len(conds) == 0 {
		return "", args
	}
	return " WHERE " + strings.Join(conds, " AND "), args
}

// List lists media files from db (a read pool), newest first, and counts
// all that match.
func List(ctx context.Context, db *sql.DB, f Filter) ([]*File, int, error) {
	where, args := f.where()
	var count int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM media_files`+where, args...).Scan(&count); err != nil {
		return nil, 0, err
	}
	q := `SELECT ` + columns + ` FROM media_files` + where + ` ORDER BY seq DESC`
	if f.Limit > 0 {
		q += ` LIMIT ? OFFSET ?`
		args = append(args, f.Limit, f.Offset)
	}
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var out []*File
	for rows.Next() {
		m, err := scan(rows)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, m)
	}
	return out, count, rows.Err()
}
