package agentdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/calltap/calltap/storage/agentdb/searchindex"
	"github.com/calltap/calltap/storage/intake"
)

// Deleting captures (calltap delete, the inspector, retention) removes,
// together: the captures rows with their bodies and attempts, their
// entries in the search index, the saved media of their calls' links, and
// the bytes of their bodies in segment files. It runs in batches of at
// most deleteBatchMax captures, each one transaction on the indexer's
// connection, which holds the index's write lock, then the store's:
//
//   - the index's lock first, as the indexer takes it: the position read
//     under it (indexed_upto) says exactly which of the captures have
//     index entries (seq ≤ it, and an indexable body), and only those are
//     removed; FTS4 has to be told the text of an entry to remove it.
//   - the store's lock is taken by the first statement that touches the
//     store, a write (the DELETE), so no stale snapshot is ever upgraded;
//     the capture writer only waits for it, for one small batch.
//
// Bodies are read before the transaction (they never change), so the
// store's lock is not held while segment files are read. Files (media,
// spans of segments) are removed after the commit: a crash in between
// leaves bytes no row names, which nothing reads.

// deleteBatchMax bounds a deletion's transaction: the capture writer
// waits for at most one batch.
const deleteBatchMax = 128

// Deleted is what a deletion removed.
type Deleted struct {
	Captures int   `json:"captures"`
	Media    int   `json:"media"`
	Bytes    int64 `json:"bytes"` // request and response bodies and media files, roughly what the disk gets back
}

func (d *Deleted) add(o Deleted) {
	d.Captures += o.Captures
	d.Media += o.Media
	d.Bytes += o.Bytes
}

// doomed is a capture picked for deletion, read before its transaction.
type doomed struct {
	seq          int64
	id           string
	size         int64
	respSize     int64
	file         string // its body's segment; "" when the body is in the database
	offset       int64
	text         []byte // the body as the index took it; nil when not indexable
	indexSkipped bool   // the body could not be read back: see deleteBatch
}

// DeleteCaptures deletes the captures with these ids (and what goes with
// them); ids that match nothing are not an error, and counted out.
func (db *AgentStore) DeleteCaptures(ctx context.Context, ids ...string) (Deleted, error) {
	if err := db.caughtUp(ctx); err != nil {
		return Deleted{}, err
	}
	var total Deleted
	for len(ids) > 0 {
		n := min(len(ids), deleteBatchMax)
		marks, args := placeholders(ids[:n])
		d, _, err := db.deleteWhere(ctx, "c.id IN ("+marks+")", args, n)
		total.add(d)
		if err != nil {
			return total, err
		}
		ids = ids[n:]
	}
	return total, nil
}

// DeleteCall deletes every capture of one call, and every media file saved
// for it (those fetched by `calltap media` too).
func (db *AgentStore) DeleteCall(ctx context.Context, callID string) (Deleted, error) {
	if err := db.caughtUp(ctx); err != nil {
		return Deleted{}, err
	}
	total, err := db.deleteAll(ctx, "c.call_id = ?", []any{callID})
	if err != nil {
		return total, err
	}
	d, err := db.deleteMediaWhere(ctx, "call_id = ?", callID)
	total.add(d)
	return total, err
}

// removable is the condition on captures c that a delete by age (and
// retention) removes: captures marked to keep and imported fixtures only
// when asked.
func removable(includeKept bool) string {
	if includeKept {
		return "1"
	}
	return "c.keep = 0 AND c.source <> 'import'"
}

// DeleteBefore deletes the captures saved before t, and the media saved
// by `calltap media` before it. Captures marked to keep and imported
// fixtures stay unless includeKept.
func (db *AgentStore) DeleteBefore(ctx context.Context, t time.Time, includeKept bool) (Deleted, error) {
	if err := db.caughtUp(ctx); err != nil {
		return Deleted{}, err
	}
	total, err := db.deleteAll(ctx, removable(includeKept)+" AND c.created_at < ?", []any{t.UnixMicro()})
	if err != nil {
		return total, err
	}
	d, err := db.deleteMediaWhere(ctx, "capture_id = '' AND created_at < ?", t.UnixMicro())
	total.add(d)
	return total, err
}

// deleteAll deletes every capture cond selects, a batch at a time.
func (db *AgentStore) deleteAll(ctx context.Context, cond string, args []any) (Deleted, error) {
	var total Deleted
	for {
		d, more, err := db.deleteWhere(ctx, cond, args, deleteBatchMax)
		total.add(d)
		if err != nil || !more {
			return total, err
		}
	}
}

// deleteWhere deletes up to limit of the oldest captures cond (on captures
// c) selects, and reports whether it found limit of them (there may be
// more).
func (db *AgentStore) deleteWhere(ctx context.Context, cond string, args []any, limit int) (_ Deleted, more bool, err error) {
	defer db.explain(&err)
	if db.index == nil {
		return Deleted{}, false, fmt.Errorf("storage: %s databases have no captures", Schema)
	}
	batch, err := db.pickDoomed(ctx, cond, args, limit)
	if err != nil || len(batch) == 0 {
		return Deleted{}, false, err
	}
	db.readDoomedText(batch)
	db.writeGate.Lock()
	out, media, err := deleteBatch(ctx, db.index, batch)
	db.writeGate.Unlock()
	if err != nil {
		return Deleted{}, false, err
	}
	db.releaseFiles(out, media)
	return deletedTotals(out, media), len(batch) == limit, nil
}

// pickDoomed reads up to limit of the oldest captures cond selects, with
// where their bodies are and, for a body kept in the row, its text for the
// search index.
func (db *AgentStore) pickDoomed(ctx context.Context, cond string, args []any, limit int) ([]*doomed, error) {
	rows, err := db.read.QueryContext(ctx, `SELECT c.seq, c.id, c.size, coalesce(length(c.response_body), 0), b.file, coalesce(b.file_offset, 0),
		CASE WHEN b.file IS NULL AND length(b.body) <= `+searchindex.MaxBodyText+` THEN b.body END
		FROM captures c LEFT JOIN capture_bodies b ON b.seq = c.seq WHERE `+cond+` ORDER BY c.seq LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("storage: pick captures to delete: %w", err)
	}
	defer rows.Close()
	var batch []*doomed
	for rows.Next() {
		d := &doomed{}
		var file sql.NullString
		var body []byte
		if err := rows.Scan(&d.seq, &d.id, &d.size, &d.respSize, &file, &d.offset, &body); err != nil {
			return nil, fmt.Errorf("storage: pick captures to delete: %w", err)
		}
		d.file = file.String
		if searchindex.Indexable(body) {
			d.text = body
		}
		batch = append(batch, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("storage: pick captures to delete: %w", err)
	}
	return batch, nil
}

// readDoomedText reads the indexable bodies of batch that are in body
// files, so that their search entries can be removed (FTS4 needs the
// text). It runs before the transaction, so the store's lock is not held
// while segment files are read (see the top of the file).
func (db *AgentStore) readDoomedText(batch []*doomed) {
	for _, d := range batch {
		if d.file == "" || d.size > searchindex.MaxBody {
			continue
		}
		body, err := db.readFileBody(d.file, d.offset, d.size)
		if err != nil {
			// Its index entry, if any, cannot be removed without the text;
			// the capture goes all the same (a search joins the captures,
			// so the entry finds nothing). Rebuilding the index drops it.
			slog.Warn("storage: deleting a capture whose body cannot be read; its search entry stays until the index is rebuilt", "id", d.id, "err", err)
			d.indexSkipped = true
			continue
		}
		if searchindex.Indexable(body) {
			d.text = body
		}
	}
}

// deletedTotals counts what a deletion removed.
func deletedTotals(gone []*doomed, media []mediaGone) Deleted {
	del := Deleted{Captures: len(gone), Media: len(media)}
	for _, d := range gone {
		del.Bytes += d.size + d.respSize
	}
	for _, m := range media {
		del.Bytes += m.size
	}
	return del
}

// mediaGone is a media file whose row a deletion removed.
type mediaGone struct {
	file string
	size int64
}

// deleteBatch is one deletion transaction (see the top of the file); it
// returns the captures of batch it deleted (another process may have
// deleted some already) and the media rows that went with them.
func deleteBatch(ctx context.Context, ix *searchindex.Indexer, batch []*doomed) (gone []*doomed, media []mediaGone, err error) {
	tx, err := ix.DB().BeginTx(ctx, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("storage: begin deleting: %w", err)
	}
	defer tx.Rollback()
	upto, err := ix.File().LockProgress(ctx, tx)
	if err != nil {
		return nil, nil, err
	}
	gone, err = deleteCaptureRows(ctx, tx, batch)
	if err != nil || len(gone) == 0 {
		return nil, nil, err
	}
	if err := ix.File().Forget(ctx, tx, indexEntries(gone), upto); err != nil {
		return nil, nil, err
	}
	if media, err = deleteDependents(ctx, tx, gone); err != nil {
		return nil, nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, nil, ix.Damage(fmt.Errorf("storage: commit deleting: %w", err))
	}
	return gone, media, nil
}

// deleteCaptureRows deletes batch's capture rows and returns those it
// deleted: another process may have deleted some already.
func deleteCaptureRows(ctx context.Context, tx *sql.Tx, batch []*doomed) (gone []*doomed, err error) {
	bySeq := make(map[int64]*doomed, len(batch))
	seqs := make([]int64, len(batch))
	for i, d := range batch {
		bySeq[d.seq], seqs[i] = d, d.seq
	}
	marks, args := placeholders(seqs)
	rows, err := tx.QueryContext(ctx, `DELETE FROM captures WHERE seq IN (`+marks+`) RETURNING seq`, args...)
	if err != nil {
		return nil, fmt.Errorf("storage: delete captures: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var seq int64
		if err := rows.Scan(&seq); err != nil {
			return nil, fmt.Errorf("storage: delete captures: %w", err)
		}
		gone = append(gone, bySeq[seq])
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("storage: delete captures: %w", err)
	}
	return gone, nil
}

// indexEntries are the search entries the captures in gone may have: none
// for a body that could not be read back (see deleteBatch).
func indexEntries(gone []*doomed) []searchindex.Entry {
	es := make([]searchindex.Entry, len(gone))
	for i, d := range gone {
		es[i] = searchindex.Entry{Seq: d.seq, Text: d.text}
		if d.indexSkipped {
			es[i].Text = nil
		}
	}
	return es
}

// deleteDependents deletes the rows that belong to the captures in gone:
// their bodies, attempts and media, returning the media rows deleted.
func deleteDependents(ctx context.Context, tx *sql.Tx, gone []*doomed) ([]mediaGone, error) {
	seqs, ids := make([]int64, 0, len(gone)), make([]string, 0, len(gone))
	for _, d := range gone {
		seqs, ids = append(seqs, d.seq), append(ids, d.id)
	}
	marks, args := placeholders(seqs)
	if _, err := tx.ExecContext(ctx, `DELETE FROM capture_bodies WHERE seq IN (`+marks+`)`, args...); err != nil {
		return nil, fmt.Errorf("storage: delete capture bodies: %w", err)
	}
	marks, args = placeholders(ids)
	if _, err := tx.ExecContext(ctx, `DELETE FROM attempts WHERE capture_id IN (`+marks+`)`, args...); err != nil {
		return nil, fmt.Errorf("storage: delete attempts: %w", err)
	}
	return deleteMediaRows(ctx, tx, `capture_id IN (`+marks+`)`, args...)
}

func deleteMediaRows(ctx context.Context, tx *sql.Tx, cond string, args ...any) ([]mediaGone, error) {
	rows, err := tx.QueryContext(ctx, `DELETE FROM media_files WHERE `+cond+` RETURNING coalesce(file, ''), coalesce(size, 0)`, args...)
	if err != nil {
		return nil, fmt.Errorf("storage: delete media: %w", err)
	}
	defer rows.Close()
	var out []mediaGone
	for rows.Next() {
		var m mediaGone
		if err := rows.Scan(&m.file, &m.size); err != nil {
			return nil, fmt.Errorf("storage: delete media: %w", err)
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// deleteMediaWhere deletes the media rows cond selects, and their files.
func (db *AgentStore) deleteMediaWhere(ctx context.Context, cond string, args ...any) (_ Deleted, err error) {
	defer db.explain(&err)
	tx, err := db.write.BeginTx(ctx, nil)
	if err != nil {
		return Deleted{}, err
	}
	defer tx.Rollback()
	media, err := deleteMediaRows(ctx, tx, cond, args...)
	if err != nil {
		return Deleted{}, err
	}
	if err := tx.Commit(); err != nil {
		return Deleted{}, err
	}
	db.releaseFiles(nil, media)
	d := Deleted{Media: len(media)}
	for _, m := range media {
		d.Bytes += m.size
	}
	return d, nil
}

// releaseFiles removes, after a deletion committed, the media files and
// the spans of bodies in segments no row names any more, and the
// segments no capture names and no process appends to. A failure is
// logged, not returned: the rows are gone, and the bytes left are never
// read.
func (db *AgentStore) releaseFiles(gone []*doomed, media []mediaGone) {
	removeMediaFiles(MediaDir(db.path), media)
	for name := range releaseBodies(BodiesDir(db.path), gone) {
		if err := db.removeSegmentIfUnused(name); err != nil {
			slog.Warn("storage: remove an unused body segment", "segment", name, "err", err)
		}
	}
}

// removeMediaFiles removes media's files from dir; a name that could lead
// out of dir is left alone.
func removeMediaFiles(dir string, media []mediaGone) {
	for _, m := range media {
		if m.file == "" || strings.ContainsAny(m.file, `/\`) || m.file == "." || m.file == ".." {
			continue
		}
		if err := os.Remove(filepath.Join(dir, m.file)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			slog.Warn("storage: remove a deleted media file", "file", m.file, "err", err)
		}
	}
}

// releaseBodies frees the spans of gone's bodies in the segments of
// bodies (the directory), and returns the segments they were in.
func releaseBodies(bodies string, gone []*doomed) (segments map[string]bool) {
	segments = map[string]bool{}
	for _, d := range gone {
		if d.file == "" {
			continue
		}
		segments[d.file] = true
		if strings.HasPrefix(d.file, intake.Prefix) {
			// Bodies in an intake log are not aligned to blocks: a
			// hole would take its neighbours' bytes too. The log goes
			// whole once no capture names it.
			continue
		}
		path, err := intake.SegmentPath(bodies, d.file)
		if err != nil {
			continue
		}
		if err := intake.ReleaseSpan(path, d.offset, d.size); err != nil && !errors.Is(err, fs.ErrNotExist) {
			slog.Warn("storage: free a deleted body's space", "segment", d.file, "err", err)
		}
	}
	return segments
}

// SetKeep marks a capture kept (retention leaves it) or not.
func (db *AgentStore) SetKeep(ctx context.Context, id string, keep bool) (err error) {
	defer db.explain(&err)
	if err := db.caughtUp(ctx); err != nil {
		return err
	}
	res, err := db.write.ExecContext(ctx, `UPDATE captures SET keep = ? WHERE id = ?`, keep, id)
	if err != nil {
		return fmt.Errorf("storage: keep: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// placeholders is "?, ?, …" for vals and vals as query arguments.
func placeholders[T any](vals []T) (string, []any) {
	args := make([]any, len(vals))
	for i, v := range vals {
		args[i] = v
	}
	return strings.TrimSuffix(strings.Repeat("?, ", len(vals)), ", "), args
}
