package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/calltap/calltap/inspector"
	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/storage/agentdb"
)

// resolveRefs reads every reference a command was given with
// inspector.ResolveCapture, in order, and fails on the first that names
// nothing or more than one capture id (its choices listed). The error
// reads as a sentence for the command's one line.
func resolveRefs(ctx context.Context, db *agentdb.AgentStore, refs []string) ([]inspector.CaptureRef, error) {
	out := make([]inspector.CaptureRef, 0, len(refs))
	for _, ref := range refs {
		r, err := inspector.ResolveCapture(ctx, db, ref)
		if e := (*api.Error)(nil); errors.As(err, &e) {
			return nil, errors.New(e.Message)
		} else if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// refNote says, for a delivery id that several captures share, which of
// them a command took: "" when the reference named one capture.
func refNote(r inspector.CaptureRef, took string) string {
	if r.By != inspector.RefDelivery || len(r.Captures) < 2 {
		return ""
	}
	return fmt.Sprintf("delivery %s has %d captures (%s); %s", r.Ref, len(r.Captures), strings.Join(r.IDs(), ", "), took)
}

// openResolved opens the agent's store in dataDir and reads the references
// a command was given; the caller closes the store.
func openResolved(ctx context.Context, dataDir string, refs []string) (*agentdb.AgentStore, []inspector.CaptureRef, error) {
	db, err := agentDB(ctx, dataDir)
	if err != nil {
		return nil, nil, err
	}
	rs, err := resolveRefs(ctx, db, refs)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return db, rs, nil
}
