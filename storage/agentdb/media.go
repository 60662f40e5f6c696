package agentdb

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"
)

// MediaFile is a recording or transcript downloaded from a signed link.
type MediaFile struct {
	Seq         int64
	ID          string
	CaptureID   string // capture whose payload carried the link; "" for `calltap media`
	CallID      string
	Kind        string // MediaRecording | MediaTranscript
	SourceURL   string
	ExpiresAt   time.Time // zero when unknown
	Status      string    // MediaPending | MediaSaved | MediaFailed
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

// Media kinds and statuses.
const (
	MediaRecording  = "recording"
	MediaTranscript = "transcript"

	MediaPending = "pending" // queued or downloading; Attempts and Error tell how it goes
	MediaSaved   = "saved"
	MediaFailed  = "failed" // gave up
)

// ClaimMedia records a link to download. When the same link of the same
// kind is already recorded (a duplicate delivery carries the same links),
// it returns that row and start=false, unless that row failed: then the
// row is reset to pending and returned with start=true, so the caller
// tries again. A new row gets f's fields and start=true.
func (db *AgentStore) ClaimMedia(ctx context.Context, f *MediaFile) (row *MediaFile, start bool, err error) {
	defer db.explain(&err)
	if err := db.caughtUp(ctx); err != nil {
		return nil, false, err
	}
	tx, err := db.write.BeginTx(ctx, nil)
	if err != nil {
		return nil, false, err
	}
	defer tx.Rollback()
	existing, err := scanMedia(tx.QueryRowContext(ctx, `SELECT `+mediaColumns+` FROM media_files WHERE source_url = ? AND kind = ? ORDER BY seq DESC LIMIT 1`, f.SourceURL, f.Kind))
	switch {
	case err == nil && existing.Status != MediaFailed:
		return existing, false, nil
	case err == nil:
		existing.Status, existing.Error, existing.UpdatedAt = MediaPending, "", f.CreatedAt
		if _, err := tx.ExecContext(ctx, `UPDATE media_files SET status = ?, error = NULL, updated_at = ? WHERE id = ?`,
			existing.Status, existing.UpdatedAt.UnixMicro(), existing.ID); err != nil {
			return nil, false, err
		}
		return existing, true, tx.Commit()
	case !errors.Is(err, sql.ErrNoRows):
		return nil, false, err
	}
	if f.Status == "" {
		f.Status = MediaPending
	}
	f.UpdatedAt = f.CreatedAt
	res, err := tx.ExecContext(ctx, `INSERT INTO media_files (id, capture_id, call_id, kind, source_url, expires_at, status, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		f.ID, f.CaptureID, f.CallID, f.Kind, f.SourceURL, micros(f.ExpiresAt), f.Status, f.CreatedAt.UnixMicro(), f.UpdatedAt.UnixMicro())
	if err != nil {
		return nil, false, err
	}
	if f.Seq, err = res.LastInsertId(); err != nil {
		return nil, false, err
	}
	return f, true, tx.Commit()
}

// UpdateMedia records the progress of a download.
func (db *AgentStore) UpdateMedia(ctx context.Context, f *MediaFile) (err error) {
	defer db.explain(&err)
	if err := db.caughtUp(ctx); err != nil {
		return err
	}
	var size sql.NullInt64
	if f.Status == MediaSaved {
		size = sql.NullInt64{Int64: f.Size, Valid: true}
	}
	_, err = db.write.ExecContext(ctx, `UPDATE media_files SET status = ?, attempts = ?, error = ?, file = ?, size = ?, content_type = ?,
		sha256 = ?, updated_at = ?, saved_at = ? WHERE id = ?`,
		f.Status, f.Attempts, nullString(f.Error), nullString(f.File), size, nullString(f.ContentType), nullString(f.SHA256),
		f.UpdatedAt.UnixMicro(), micros(f.SavedAt), f.ID)
	return err
}

const mediaColumns = `seq, id, capture_id, call_id, kind, source_url, expires_at, status, attempts, error, file, size, content_type,
	sha256, created_at, updated_at, saved_at`

func scanMedia(sc interface{ Scan(...any) error }) (*MediaFile, error) {
	var (
		f                        MediaFile
		errTxt, file, ctype, sum sql.NullString
		expires, size, saved     sql.NullInt64
		created, updated         int64
	)
	if err := sc.Scan(&f.Seq, &f.ID, &f.CaptureID, &f.CallID, &f.Kind, &f.SourceURL, &expires, &f.Status, &f.Attempts, &errTxt,
		&file, &size, &ctype, &sum, &created, &updated, &saved); err != nil {
		return nil, err
	}
	f.ExpiresAt, f.SavedAt = fromMicros(expires), fromMicros(saved)
	f.Error, f.File, f.ContentType, f.SHA256, f.Size = errTxt.String, file.String, ctype.String, sum.String, size.Int64
	f.CreatedAt, f.UpdatedAt = time.UnixMicro(created).UTC(), time.UnixMicro(updated).UTC()
	return &f, nil
}

// Media loads one media file record.
func (db *AgentStore) Media(ctx context.Context, id string) (_ *MediaFile, err error) {
	defer db.explain(&err)
	if err := db.caughtUp(ctx); err != nil {
		return nil, err
	}
	f, err := scanMedia(db.read.QueryRowContext(ctx, `SELECT `+mediaColumns+` FROM media_files WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	return f, err
}

// MediaFilter narrows a media listing. Zero fields do not filter; a zero
// Limit lists every match.
type MediaFilter struct {
	CallID    string
	CaptureID string
	SourceURL string
	Kind      string
	Status    string
	Page
}

// MediaFiles lists media files, newest first, and counts all that match.
func (db *AgentStore) MediaFiles(ctx context.Context, f MediaFilter) (_ []*MediaFile, _ int, err error) {
	defer db.explain(&err)
	if err := db.caughtUp(ctx); err != nil {
		return nil, 0, err
	}
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
	where := ""
	if len(conds) > 0 {
		where = " WHERE " + strings.Join(conds, " AND ")
	}
	var count int
	if err := db.read.QueryRowContext(ctx, `SELECT count(*) FROM media_files`+where, args...).Scan(&count); err != nil {
		return nil, 0, err
	}
	q := `SELECT ` + mediaColumns + ` FROM media_files` + where + ` ORDER BY seq DESC`
	if f.Limit > 0 {
		q += ` LIMIT ? OFFSET ?`
		args = append(args, f.Limit, f.Offset)
	}
	rows, err := db.read.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var out []*MediaFile
	for rows.Next() {
		m, err := scanMedia(rows)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, m)
	}
	return out, count, rows.Err()
}
