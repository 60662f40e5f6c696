package inspector_test

import (
	"slices"
	"testing"

	"github.com/calltap/calltap/inspector"
)

// The headers an agent made senders present are masked by every later
// export of its data directory, across runs, each name once.
func TestExportMaskKeepsTheRequiredHeaders(t *testing.T) {
	dir := t.TempDir()
	if got, err := inspector.ExportMask(dir, []string{"X-Extra"}); err != nil || !slices.Equal(got, append(inspector.SecretHeaders(), "X-Extra")) {
		t.Fatalf("a directory no agent required headers of: %q, %v", got, err)
	}
	if err := inspector.RecordRequiredHeaders(dir, []string{"X-Secret: s3cret", "authorization: Bearer x"}); err != nil {
		t.Fatal(err)
	}
	if err := inspector.RecordRequiredHeaders(dir, []string{"X-Other: 1", "x-secret: again"}); err != nil {
		t.Fatal(err)
	}
	got, err := inspector.ExportMask(dir, []string{"x-other", "X-Extra"})
	if err != nil {
		t.Fatal(err)
	}
	want := append(inspector.SecretHeaders(), "X-Secret", "X-Other", "X-Extra")
	if !slices.Equal(got, want) {
		t.Errorf("masked %q, want %q", got, want)
	}
}
