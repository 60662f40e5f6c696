package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/calltap/calltap/scripts/chaos/history"
)

// exported is the part of a line of `calltap export` (inspector's Detail)
// the checker needs.
type exported struct {
	ID             string `json:"id"`
	CreatedAt      string `json:"created_at"`
	DeliveryID     string `json:"delivery_id"`
	Status         string `json:"status"`
	ResponseStatus *int   `json:"response_status"`
	Error          string `json:"error"`
	DuplicateOf    string `json:"duplicate_of"`
	Queued         bool   `json:"queued"`
}

// readStore reads every capture of the stopped agent's store with
// `calltap export`, the built binary's own reading of it, so that a store
// written by another build (CHAOS_BIN) is read by that build.
func readStore(ctx context.Context, bin, dataDir, tunnel string) ([]history.Capture, error) {
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "export", "--data", dataDir, "--include-secrets")
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		if strings.Contains(errOut.String(), "nothing to export") {
			return nil, nil
		}
		return nil, fmt.Errorf("calltap export: %w: %s", err, strings.TrimSpace(errOut.String()))
	}
	return parseExport(out.Bytes(), tunnel)
}

// parseExport turns an export (a header line, then a capture a line) into
// the history's captures.
func parseExport(b []byte, tunnel string) ([]history.Capture, error) {
	var caps []history.Capture
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 256<<20)
	for line := 1; sc.Scan(); line++ {
		if line == 1 {
			continue // the export's header
		}
		var e exported
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("calltap export line %d: %w", line, err)
		}
		c := history.Capture{CaptureID: e.ID, Tunnel: tunnel, DeliveryID: e.DeliveryID, State: e.Status,
			DuplicateOf: e.DuplicateOf, Queued: e.Queued, Error: e.Error}
		if e.ResponseStatus != nil {
			c.ResponseStatus = *e.ResponseStatus
		}
		if t, err := time.Parse(time.RFC3339Nano, e.CreatedAt); err == nil {
			c.ReceivedAt = t.UnixNano()
		}
		caps = append(caps, c)
	}
	return caps, sc.Err()
}
