package agentdb

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// A link claimed twice (a duplicate delivery) is downloaded once; one
// whose download failed is claimed again, reset to pending; what a
// download records reads back.
func TestClaimMediaOncePerLink(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	link := func(id string) *MediaFile {
		return &MediaFile{ID: id, CaptureID: "cap-1", CallID: "call-1", Kind: MediaRecording, SourceURL: "https://media.example/rec-1",
			ExpiresAt: capT0.Add(time.Hour), CreatedAt: capT0}
	}
	first, start, err := db.ClaimMedia(ctx, link("m-1"))
	if err != nil || !start || first.Status != MediaPending || first.Seq == 0 {
		t.Fatalf("first claim: %+v, start %v, %v", first, start, err)
	}
	again, start, err := db.ClaimMedia(ctx, link("m-2"))
	if err != nil || start || again.ID != "m-1" {
		t.Fatalf("second claim: %+v, start %v, %v; want m-1, not started", again, start, err)
	}
	// The same link as a transcript is another file.
	tr := link("m-3")
	tr.Kind = MediaTranscript
	if _, start, err := db.ClaimMedia(ctx, tr); err != nil || !start {
		t.Fatalf("the transcript: start %v, %v", start, err)
	}
	first.Status, first.Attempts, first.Error, first.UpdatedAt = MediaFailed, 3, "410 Gone", capT0.Add(time.Minute)
	if err := db.UpdateMedia(ctx, first); err != nil {
		t.Fatal(err)
	}
	retry := link("m-4")
	retry.CreatedAt = capT0.Add(2 * time.Minute)
	row, start, err := db.ClaimMedia(ctx, retry)
	if err != nil || !start || row.ID != "m-1" || row.Status != MediaPending || row.Error != "" || !row.UpdatedAt.Equal(retry.CreatedAt) {
		t.Fatalf("a claim after a failure: %+v, start %v, %v; want m-1 pending again", row, start, err)
	}
	if got, err := db.Media(ctx, "m-1"); err != nil || got.Status != MediaPending || got.Error != "" || got.Attempts != 3 {
		t.Fatalf("m-1 after the new claim: %+v, %v", got, err)
	}
	row.Status, row.File, row.Size, row.ContentType, row.SHA256 = MediaSaved, "rec-1.mp3", 5000, "audio/mpeg", "ab12"
	row.UpdatedAt, row.SavedAt = capT0.Add(3*time.Minute), capT0.Add(3*time.Minute)
	if err := db.UpdateMedia(ctx, row); err != nil {
		t.Fatal(err)
	}
	got, err := db.Media(ctx, "m-1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != MediaSaved || got.File != "rec-1.mp3" || got.Size != 5000 || got.ContentType != "audio/mpeg" || got.SHA256 != "ab12" ||
		!got.SavedAt.Equal(row.SavedAt) || !got.ExpiresAt.Equal(capT0.Add(time.Hour)) || !got.CreatedAt.Equal(capT0) {
		t.Errorf("saved media read back as %+v", got)
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
