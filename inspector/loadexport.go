package inspector

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/agentdb"
)

// LoadExport reads the export file into db (a throwaway store, so that a
// call replays from a file exactly as from the store) and returns the
// headers the export masked.
func LoadExport(ctx context.Context, db *agentdb.AgentStore, file string) ([]string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ef, err := ReadExport(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if _, err := Import(ctx, db, ef.Captures); err != nil {
		return nil, err
	}
	return ef.Header.MaskedHeaders, nil
}

// Unsupplied is the masked headers of an export that db's captures hold
// (as MaskedValue) and given does not give again.
func Unsupplied(ctx context.Context, db *agentdb.AgentStore, masked []string, given wire.Header) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	_, err := db.EachCapture(ctx, agentdb.CaptureFilter{}, func(c *agentdb.Capture) error {
		var h wire.Header
		if h.UnmarshalJSON([]byte(c.RequestHeaders)) != nil {
			return nil
		}
		for _, f := range h {
			if f.Value != MaskedValue || given.Get(f.Name) != "" || seen[strings.ToLower(f.Name)] {
				continue
			}
			for _, m := range masked {
				if strings.EqualFold(m, f.Name) {
					seen[strings.ToLower(f.Name)] = true
					out = append(out, f.Name)
				}
			}
		}
		return nil
	})
	return out, err
}
