package agentdb

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// mediaState is what a test checks of a media record.
type mediaState struct {
	ID, Status, Error, File, ContentType, SHA256 string
	Attempts                                     int
	Size                                         int64
	UpdatedAt, SavedAt, ExpiresAt                time.Time
}

func stateOf(m *MediaFile) mediaState {
	return mediaState{m.ID, m.Status, m.Error, m.File, m.ContentType, m.SHA256, m.Attempts, m.Size, m.UpdatedAt, m.SavedAt, m.ExpiresAt}
}

// claim claims f and checks whether it is to be started and what record
// it returns.
func claim(t *testing.T, db *AgentStore, f *MediaFile, wantStart bool, want mediaState) *MediaFile {
	t.Helper()
	row, start, err := db.ClaimMedia(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	if start != wantStart || stateOf(row) != want {
		t.Fatalf("claim of %s: start %v, %+v; want %v, %+v", f.ID, start, stateOf(row), wantStart, want)
	}
	return row
}

// A link claimed twice (a duplicate delivery) is downloaded once; one
// whose download failed is claimed again, reset to pending; what a
// download records reads back.
func TestClaimMediaOncePerLink(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	expires := capT0.Add(time.Hour)
	link := func(id string, at time.Time) *MediaFile {
		return &MediaFile{ID: id, CaptureID: "cap-1", CallID: "call-1", Kind: MediaRecording, SourceURL: "https://media.example/rec-1",
			ExpiresAt: expires, CreatedAt: at}
	}
	pending := mediaState{ID: "m-1", Status: MediaPending, UpdatedAt: capT0, ExpiresAt: expires}
	first := claim(t, db, link("m-1", capT0), true, pending)
	if first.Seq == 0 {
		t.Fatal("the new record has no seq")
	}
	claim(t, db, link("m-2", capT0), false, pending)
	// The same link as a transcript is another file.
	tr := link("m-3", capT0)
	tr.Kind = MediaTranscript
	claim(t, db, tr, true, mediaState{ID: "m-3", Status: MediaPending, UpdatedAt: capT0, ExpiresAt: expires})

	first.Status, first.Attempts, first.Error, first.UpdatedAt = MediaFailed, 3, "410 Gone", capT0.Add(time.Minute)
	if err := db.UpdateMedia(ctx, first); err != nil {
		t.Fatal(err)
	}
	retried := mediaState{ID: "m-1", Status: MediaPending, Attempts: 3, UpdatedAt: capT0.Add(2 * time.Minute), ExpiresAt: expires}
	row := claim(t, db, link("m-4", capT0.Add(2*time.Minute)), true, retried)
	if got, err := db.Media(ctx, "m-1"); err != nil || stateOf(got) != retried {
		t.Fatalf("m-1 after the new claim: %+v, %v; want %+v", got, err, retried)
	}

	row.Status, row.File, row.Size, row.ContentType, row.SHA256 = MediaSaved, "rec-1.mp3", 5000, "audio/mpeg", "ab12"
	row.UpdatedAt, row.SavedAt = capT0.Add(3*time.Minute), capT0.Add(3*time.Minute)
	if err := db.UpdateMedia(ctx, row); err != nil {
		t.Fatal(err)
	}
	if got, err := db.Media(ctx, "m-1"); err != nil || stateOf(got) != stateOf(row) || !got.CreatedAt.Equal(capT0) {
		t.Errorf("saved media read back as %+v (%v), want %+v", got, err, stateOf(row))
	}
	if _, err := db.Media(ctx, "no-such"); !errors.Is(err, ErrNotFound) {
		t.Errorf("an unknown media id: %v, want ErrNotFound", err)
	}
}

// MediaFiles filters by each field given, lists newest first, pages, and
// counts every match.
func TestMediaFilesFiltersAndPages(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	for i, m := range []struct{ call, kind string }{
		{"call-1", MediaRecording}, {"call-1", MediaTranscript}, {"call-2", MediaRecording}, {"call-1", MediaRecording},
	} {
		f := &MediaFile{ID: "m-" + string(rune('a'+i)), CaptureID: "cap-" + m.call, CallID: m.call, Kind: m.kind,
			SourceURL: "https://media.example/" + string(rune('a'+i)), CreatedAt: capT0}
		if _, _, err := db.ClaimMedia(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(ms []*MediaFile) []string {
		var out []string
		for _, m := range ms {
			out = append(out, m.ID)
		}
		return out
	}
	for _, tc := range []struct {
		f     MediaFilter
		want  []string
		count int
	}{
		{MediaFilter{}, []string{"m-d", "m-c", "m-b", "m-a"}, 4},
		{MediaFilter{CallID: "call-1"}, []string{"m-d", "m-b", "m-a"}, 3},
		{MediaFilter{CaptureID: "cap-call-2"}, []string{"m-c"}, 1},
		{MediaFilter{CallID: "call-1", Kind: MediaRecording}, []string{"m-d", "m-a"}, 2},
		{MediaFilter{SourceURL: "https://media.example/b"}, []string{"m-b"}, 1},
		{MediaFilter{Status: MediaSaved}, nil, 0},
		{MediaFilter{Page: Page{Limit: 2, Offset: 1}}, []string{"m-c", "m-b"}, 4},
	} {
		got, n, err := db.MediaFiles(ctx, tc.f)
		if err != nil || n != tc.count || !slices.Equal(ids(got), tc.want) {
			t.Errorf("%+v: %v (count %d, %v), want %v (count %d)", tc.f, ids(got), n, err, tc.want, tc.count)
		}
	}
}
