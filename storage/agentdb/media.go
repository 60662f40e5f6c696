package agentdb

import (
	"context"

	"github.com/calltap/calltap/storage/agentdb/mediafile"
)

// The media files table's statements are storage/agentdb/mediafile's; the
// store serves them, each once the intake log is applied.
type (
	// MediaFile is a recording or transcript downloaded from a signed link.
	MediaFile = mediafile.File
	// MediaFilter narrows a media listing.
	MediaFilter = mediafile.Filter
)

// Media kinds and statuses.
const (
	MediaRecording  = mediafile.Recording
	MediaTranscript = mediafile.Transcript
	MediaPending    = mediafile.Pending
	MediaSaved      = mediafile.Saved
	MediaFailed     = mediafile.Failed
)

// ClaimMedia records a link to download (mediafile.Claim).
func (db *AgentStore) ClaimMedia(ctx context.Context, f *MediaFile) (row *MediaFile, start bool, err error) {
	defer db.explain(&err)
	if err := db.caughtUp(ctx); err != nil {
		return nil, false, err
	}
	return mediafile.Claim(ctx, db.write, f)
}

// UpdateMedia records the progress of a download.
func (db *AgentStore) UpdateMedia(ctx context.Context, f *MediaFile) (err error) {
	defer db.explain(&err)
	if err := db.caughtUp(ctx); err != nil {
		return err
	}
	return mediafile.Update(ctx, db.write, f)
}

// Media loads one media file record.
func (db *AgentStore) Media(ctx context.Context, id string) (_ *MediaFile, err error) {
	defer db.explain(&err)
	if err := db.caughtUp(ctx); err != nil {
		return nil, err
	}
	return mediafile.Get(ctx, db.read, id)
}

// MediaFiles lists media files, newest first, and counts all that match.
func (db *AgentStore) MediaFiles(ctx context.Context, f MediaFilter) (_ []*MediaFile, _ int, err error) {
	defer db.explain(&err)
	if err := db.caughtUp(ctx); err != nil {
		return nil, 0, err
	}
	return mediafile.List(ctx, db.read, f)
}
