package agentdb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/storage/agentdb/searchindex"
	"github.com/calltap/calltap/storage/intake"
)

// ftsCount counts the search index's own entries for word, whether or not
// their captures still exist (a search joins captures and would hide a
// leftover entry).
func ftsCount(t *testing.T, db *AgentStore, word string) int {
	t.Helper()
	var n int
	if err := db.read.QueryRow(`SELECT count(*) FROM search.captures_fts WHERE body MATCH ?`, word).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func saveMediaFile(t *testing.T, db *AgentStore, captureID, callID, name string, size int) {
	t.Helper()
	ctx := context.Background()
	row, _, err := db.ClaimMedia(ctx, &MediaFile{ID: "m-" + name, CaptureID: captureID, CallID: callID, Kind: MediaRecording,
		SourceURL: "https://media.example/" + name, CreatedAt: capT0, UpdatedAt: capT0})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(MediaDir(db.path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(MediaDir(db.path), name), bytes.Repeat([]byte("m"), size), 0o600); err != nil {
		t.Fatal(err)
	}
	row.Status, row.File, row.Size, row.SavedAt = MediaSaved, name, int64(size), capT0
	if err := db.UpdateMedia(ctx, row); err != nil {
		t.Fatal(err)
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// Deleting captures removes their rows, bodies, attempts, search entries,
// media files and segment files; the others stay whole and searchable.
func TestDeleteCapturesRemovesEverything(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agent.db")
	db := openAgentAt(t, path)
	large := []byte(`{"note":"zebrafile ` + strings.Repeat("x", intake.BodyMin) + `"}`)
	gone := []*Capture{testCapture(1, []byte(`{"city":"aardvark"}`)), testCapture(2, large), testCapture(3, binaryBody)}
	stay := testCapture(4, []byte(`{"city":"aardvark buffalo"}`))
	saveCaptures(t, db, append(gone, stay)...)
	if _, err := db.WriteCaptures(ctx, nil, []*Capture{answeredCapture(gone[0]), answeredCapture(stay)}); err != nil {
		t.Fatal(err)
	}
	saveMediaFile(t, db, gone[0].ID, gone[0].CallID, "rec-gone.mp3", 5000)
	saveMediaFile(t, db, stay.ID, "call-other", "rec-stay.mp3", 10)
	if err := db.CatchUpSearch(ctx); err != nil {
		t.Fatal(err)
	}
	if ftsCount(t, db, "aardvark") != 2 || ftsCount(t, db, "zebrafile") != 1 {
		t.Fatal("index entries missing before the delete")
	}
	segs, _ := filepath.Glob(filepath.Join(BodiesDir(path), "*.seg"))
	if len(segs) != 1 {
		t.Fatalf("segments %v", segs)
	}
	// A second store on the same file (calltap delete beside the agent):
	// the segment the first one appends to is held, so only its span goes.
	cli := openAgentAt(t, path)
	d, err := cli.DeleteCaptures(ctx, gone[0].ID, gone[1].ID, gone[2].ID, "no-such-id")
	if err != nil {
		t.Fatal(err)
	}
	if d.Captures != 3 || d.Media != 1 {
		t.Fatalf("deleted %+v", d)
	}
	for _, c := range gone {
		if _, err := db.Capture(ctx, c.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("capture %s after delete: %v", c.ID, err)
		}
		if a, _ := db.Attempts(ctx, c.ID); len(a) != 0 {
			t.Fatalf("attempts of %s left: %v", c.ID, a)
		}
	}
	var bodies int
	db.read.QueryRow(`SELECT count(*) FROM capture_bodies`).Scan(&bodies)
	if bodies != 1 {
		t.Fatalf("%d bodies left, want 1", bodies)
	}
	if ftsCount(t, db, "aardvark") != 1 || ftsCount(t, db, "zebrafile") != 0 {
		t.Fatalf("index entries left: aardvark %d zebrafile %d", ftsCount(t, db, "aardvark"), ftsCount(t, db, "zebrafile"))
	}
	if got := searchIDs(t, db, "aardvark"); len(got) != 1 || got[0] != stay.ID {
		t.Fatalf("search after delete: %v", got)
	}
	if exists(filepath.Join(MediaDir(path), "rec-gone.mp3")) || !exists(filepath.Join(MediaDir(path), "rec-stay.mp3")) {
		t.Fatal("media files: want the deleted capture's gone and the other kept")
	}
	fi, err := os.Stat(segs[0])
	if err != nil {
		t.Fatalf("the held segment was removed: %v", err)
	}
	if intake.Allocated(fi) >= int64(intake.BodyMin) {
		t.Fatalf("the deleted body's span still takes %d bytes", intake.Allocated(fi))
	}
	// Seqs are not reused: the next capture is indexed and searchable.
	next := testCapture(5, []byte(`{"city":"aardvark"}`))
	saveCaptures(t, db, next)
	if next.Seq <= stay.Seq {
		t.Fatalf("seq %d reused (newest was %d)", next.Seq, stay.Seq)
	}
	if got := searchIDs(t, db, "aardvark"); len(got) != 2 {
		t.Fatalf("search after a new capture: %v", got)
	}
	// Nor is the seq of a deleted newest capture.
	if _, err := db.DeleteCaptures(ctx, next.ID); err != nil {
		t.Fatal(err)
	}
	again := testCapture(7, []byte(`{"city":"aardvark"}`))
	saveCaptures(t, db, again)
	if again.Seq <= next.Seq {
		t.Fatalf("seq %d of a deleted capture reused", again.Seq)
	}
	// Once no process appends to it, an unused segment is removed.
	big := testCapture(6, large)
	saveCaptures(t, db, big)
	segs2, _ := filepath.Glob(filepath.Join(BodiesDir(path), "*.seg"))
	db.Close()
	if _, err := cli.DeleteCaptures(ctx, big.ID); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(BodiesDir(path), "*.seg")); len(left) != 0 {
		t.Fatalf("segments left %v (had %v)", left, segs2)
	}
}

// DeleteCall removes a call's captures and every media file of the call.
func TestDeleteCall(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	var cs []*Capture
	for i := 0; i < 10; i++ {
		cs = append(cs, testCapture(i, []byte(`{"n":1}`)))
	}
	saveCaptures(t, db, cs...)
	saveMediaFile(t, db, "", "call-0", "by-cli.mp3", 10)
	d, err := db.DeleteCall(ctx, "call-0")
	if err != nil {
		t.Fatal(err)
	}
	if d.Captures != 5 || d.Media != 1 {
		t.Fatalf("deleted %+v", d)
	}
	rows, n, err := db.Captures(ctx, CaptureFilter{Page: Page{Limit: 50}})
	if err != nil || n != 5 {
		t.Fatalf("left %d (%v)", n, err)
	}
	for _, c := range rows {
		if c.CallID == "call-0" {
			t.Fatalf("capture of the deleted call left: %s", c.ID)
		}
	}
	if exists(filepath.Join(MediaDir(db.path), "by-cli.mp3")) {
		t.Fatal("the call's media file is left")
	}
}

// Retention prunes the oldest first, leaves captures kept and imported
// fixtures (unless asked), and hands the space back.
func TestPruneByAgeKeepsKeptAndImported(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	body := []byte(`{"text":"` + strings.Repeat("lorem ipsum ", 300) + `"}`)
	var cs []*Capture
	for i := 0; i < 2000; i++ {
		cs = append(cs, testCapture(i, body))
	}
	cs[10].Source = "import"
	saveCaptures(t, db, cs...)
	if err := db.SetKeep(ctx, cs[5].ID, true); err != nil {
		t.Fatal(err)
	}
	if err := db.SetKeep(ctx, "no-such", true); !errors.Is(err, ErrNotFound) {
		t.Fatalf("keep of a missing capture: %v", err)
	}
	if err := db.CatchUpSearch(ctx); err != nil {
		t.Fatal(err)
	}
	var before, after int
	db.read.QueryRow(`PRAGMA page_count`).Scan(&before)
	// Everything before capture 1500 is older than the limit.
	now := cs[1500].CreatedAt.Add(time.Hour)
	d, err := db.Prune(ctx, Retention{MaxAge: time.Hour, Pause: time.Millisecond}, now)
	if err != nil {
		t.Fatal(err)
	}
	if d.Captures != 1498 {
		t.Fatalf("pruned %d, want 1498", d.Captures)
	}
	for _, i := range []int{5, 10, 1500, 1999} {
		c, err := db.Capture(ctx, cs[i].ID)
		if err != nil {
			t.Fatalf("capture %d: %v", i, err)
		}
		if i == 5 && !c.Keep {
			t.Fatal("the kept capture lost its mark")
		}
	}
	if _, err := db.Capture(ctx, cs[0].ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the oldest capture: %v", err)
	}
	if got := ftsCount(t, db, "lorem"); got != 502 {
		t.Fatalf("%d index entries, want 502", got)
	}
	// The pages come back to the file system: none left free, and the
	// file's pages (what a checkpoint leaves in it) far fewer.
	var free int
	db.read.QueryRow(`PRAGMA freelist_count`).Scan(&free)
	db.read.QueryRow(`PRAGMA page_count`).Scan(&after)
	if free != 0 || after >= before/2 {
		t.Fatalf("space not back: %d free pages, %d pages (was %d)", free, after, before)
	}
	// Asked to, retention prunes kept and imported captures too.
	if _, err := db.Prune(ctx, Retention{MaxAge: time.Hour, PruneKept: true}, now); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Capture(ctx, cs[5].ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("kept capture with PruneKept: %v", err)
	}
}

// MaxBytes brings the store under the size, oldest first.
func TestPruneToMaxBytes(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	var cs []*Capture
	for i := 0; i < 40; i++ {
		cs = append(cs, testCapture(i, bytes.Repeat([]byte{byte('a' + i%26)}, intake.BodyMin)))
	}
	saveCaptures(t, db, cs...)
	// The index is part of the store: measure once it holds the bodies.
	if err := db.CatchUpSearch(ctx); err != nil {
		t.Fatal(err)
	}
	used, err := db.DiskUsage()
	if err != nil {
		t.Fatal(err)
	}
	limit := used / 2
	if _, err := db.Prune(ctx, Retention{MaxBytes: limit}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if used, _ = db.DiskUsage(); used > limit {
		var files []string
		filepath.WalkDir(filepath.Dir(db.path), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				fi, _ := d.Info()
				files = append(files, fmt.Sprintf("%s %d", p, intake.Allocated(fi)))
			}
			return nil
		})
		t.Fatalf("usage %d over the limit %d: %v", used, limit, files)
	}
	if _, err := db.Capture(ctx, cs[0].ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the oldest capture: %v", err)
	}
	if _, err := db.Capture(ctx, cs[39].ID); err != nil {
		t.Fatalf("the newest capture: %v", err)
	}
}

// A prune of many captures goes in small batches: a writer saving all
// along keeps saving, its commits interleaved with the batches.
func TestPruneLetsWritesThrough(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	var cs []*Capture
	for i := 0; i < 4000; i++ {
		cs = append(cs, testCapture(i, []byte(`{"n":"old capture"}`)))
	}
	saveCaptures(t, db, cs...)
	if err := db.CatchUpSearch(ctx); err != nil {
		t.Fatal(err)
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		during  int
		pruning = make(chan struct{})
		werr    error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 10_000; ; i++ {
			select {
			case <-pruning:
				return
			default:
			}
			c := testCapture(i, []byte(`{"n":"new capture"}`))
			c.CreatedAt = time.Now()
			if _, err := db.WriteCaptures(ctx, []*Capture{c}, nil); err != nil {
				werr = err
				return
			}
			mu.Lock()
			during++
			mu.Unlock()
		}
	}()
	d, err := db.Prune(ctx, Retention{MaxAge: time.Hour, Pause: 2 * time.Millisecond}, time.Now())
	close(pruning)
	wg.Wait()
	if err != nil || werr != nil {
		t.Fatal(err, werr)
	}
	if d.Captures != 4000 {
		t.Fatalf("pruned %d", d.Captures)
	}
	// 4000 captures are 32 batches at most deleteBatchMax each: writes
	// went through between them.
	if during < 2 {
		t.Fatalf("only %d writes during the prune", during)
	}
	if _, n, err := db.Captures(ctx, CaptureFilter{Text: "new", Page: Page{Limit: 1}}); err != nil || n != during {
		t.Fatalf("search finds %d of the %d captures saved during the prune (%v)", n, during, err)
	}
}

// A body of exactly searchindex.MaxBody bytes kept in a segment is indexed, and
// its entry goes with it, the newest indexed capture as any other; the
// deletion counts its request and response bodies.
func TestDeleteForgetsTheLargestIndexedBody(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	head := `{"w":"quokka `
	body := []byte(head + strings.Repeat("x", searchindex.MaxBody-len(head)-2) + `"}`)
	c := testCapture(1, body)
	saveCaptures(t, db, c)
	answer := answeredCapture(c)
	if _, err := db.WriteCaptures(ctx, nil, []*Capture{answer}); err != nil {
		t.Fatal(err)
	}
	if err := db.CatchUpSearch(ctx); err != nil {
		t.Fatal(err)
	}
	if n := ftsCount(t, db, "quokka"); n != 1 {
		t.Fatalf("%d index entries of the body before the delete, want 1", n)
	}
	d, err := db.DeleteCaptures(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(len(body) + len(answer.ResponseBody)); d.Captures != 1 || d.Bytes != want {
		t.Errorf("deleted %+v, want 1 capture of %d bytes", d, want)
	}
	if n := ftsCount(t, db, "quokka"); n != 0 {
		t.Errorf("%d index entries left of the deleted body", n)
	}
}

// A call of more captures than one deletion batch goes whole, and the
// count covers every batch.
func TestDeleteCallOfManyBatches(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	var cs []*Capture
	for i := range 2*deleteBatchMax + 1 {
		c := testCapture(i, []byte(`{"n":1}`))
		c.CallID = "call-long"
		cs = append(cs, c)
	}
	saveCaptures(t, db, cs...)
	d, err := db.DeleteCall(ctx, "call-long")
	if err != nil {
		t.Fatal(err)
	}
	if d.Captures != len(cs) {
		t.Errorf("deleted %+v, want %d captures", d, len(cs))
	}
	if _, n, err := db.Captures(ctx, CaptureFilter{CallID: "call-long", Page: Page{Limit: 1}}); err != nil || n != 0 {
		t.Errorf("%d captures of the call left (%v)", n, err)
	}
}

// DeleteBefore deletes the captures saved before t and the media
// `calltap media` saved before it; a kept capture stays unless asked.
func TestDeleteBefore(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	var cs []*Capture
	for i := range 6 {
		cs = append(cs, testCapture(i, []byte(`{"n":1}`)))
	}
	saveCaptures(t, db, cs...)
	if err := db.SetKeep(ctx, cs[0].ID, true); err != nil {
		t.Fatal(err)
	}
	saveMediaFile(t, db, "", "call-9", "by-cli.mp3", 10) // created at capT0
	cut := capT0.Add(3 * time.Millisecond)               // after captures 0-2
	d, err := db.DeleteBefore(ctx, cut, false)
	if err != nil || d.Captures != 2 || d.Media != 1 {
		t.Fatalf("deleted %+v (%v), want captures 1 and 2 and the media file", d, err)
	}
	left, n, err := db.Captures(ctx, CaptureFilter{Page: Page{Limit: 10}})
	if want := []string{cs[5].ID, cs[4].ID, cs[3].ID, cs[0].ID}; err != nil || n != 4 || !slices.Equal(ids(left), want) {
		t.Fatalf("left %v (%v), want %v", ids(left), err, want)
	}
	if d, err := db.DeleteBefore(ctx, cut, true); err != nil || d.Captures != 1 {
		t.Fatalf("with the kept: deleted %+v (%v), want the kept capture", d, err)
	}
}

// A deletion's files go quietly; only one that could not be removed (here
// a directory holding something, in the media file's or the segment's
// place) is logged, by name. One already gone is not a failure.
func TestReleaseFilesWarnsOnlyWhatFailed(t *testing.T) {
	logs := captureLog(t)
	dir := t.TempDir()
	mkfile := func(name string, n int) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), make([]byte, n), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	mkstuck := func(name string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(dir, name, "inside"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	mkfile("gone.wav", 10)
	mkstuck("stuck.wav")
	removeMediaFiles(dir, []mediaGone{{file: "gone.wav"}, {file: "stuck.wav"}, {file: "never.wav"}})
	if _, err := os.Stat(filepath.Join(dir, "gone.wav")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a deleted media file is still there: %v", err)
	}
	if got := logs.lines("remove a deleted media file"); len(got) != 1 || !strings.Contains(got[0], "stuck.wav") {
		t.Errorf("media warnings %q, want one naming stuck.wav", got)
	}

	mkfile("freed.seg", 3*4096)
	mkstuck("stuck.seg")
	segs := releaseBodies(dir, []*doomed{{file: "freed.seg", offset: 4096, size: 4096},
		{file: "stuck.seg", size: 4096}, {file: "never.seg", size: 4096}, {file: ""}})
	if want := map[string]bool{"freed.seg": true, "stuck.seg": true, "never.seg": true}; !maps.Equal(segs, want) {
		t.Errorf("segments %v, want %v", segs, want)
	}
	if got := logs.lines("free a deleted body's space"); len(got) != 1 || !strings.Contains(got[0], "stuck.seg") {
		t.Errorf("segment warnings %q, want one naming stuck.seg", got)
	}
}
