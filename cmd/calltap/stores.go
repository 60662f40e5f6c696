package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
	"github.com/calltap/calltap/storage/relaydb"
)

// Opening the stores a command reads or writes: the agent's, the relay's.

func agentDB(ctx context.Context, dataDir string, opts ...agentdb.Option) (*agentdb.AgentStore, error) {
	return agentdb.OpenAgent(ctx, filepath.Join(dataDir, "agent.db"), opts...)
}

// readAgentDB opens the agent's store for a command that only reads it. It
// creates nothing: with no store in dataDir it returns a nil store (and no
// error), and the command says so. path is the store's file either way.
//
// The store is opened read-only (agentdb.OpenAgentReader): reading needs
// no room, works on a read-only copy, and sees every request a running
// agent has answered. What only a writer can add (requests an agent that
// was killed left in its log; for a search, captures the index lacks) is
// added by opening the store to write, where that works; where it does
// not, the command says what its answer leaves out, in one line on
// stderr, and reads what there is.
func readAgentDB(ctx context.Context, stdio Stdio, cmd, dataDir string, search bool) (db *agentdb.AgentStore, path string, err error) {
	path = filepath.Join(dataDir, "agent.db")
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil, path, nil
	} else if err != nil {
		return nil, path, err
	}
	if db, err = agentdb.OpenAgentReader(ctx, path); err != nil {
		return nil, path, err
	}
	lag, err := db.Behind(ctx)
	if err != nil {
		db.Close()
		return nil, path, err
	}
	if !search {
		lag.Unindexed = 0
	}
	if lag == (agentdb.Lag{}) {
		return db, path, nil
	}
	werr := errors.New("its file system is read-only or full")
	if storage.Writable(dataDir) {
		db.Close()
		w, err := agentDB(ctx, dataDir)
		if err == nil {
			return w, path, nil
		}
		werr = err
		if db, err = agentdb.OpenAgentReader(ctx, path); err != nil {
			return nil, path, err
		}
	}
	if lag.Migrations > 0 {
		db.Close()
		return nil, path, fmt.Errorf("the store at %s is of an older calltap, and cannot be brought up to date (%v): open it once with this calltap where it can be written", path, werr)
	}
	fmt.Fprintf(stdio.Err, "calltap %s: this leaves out %s: the store cannot be written to add them (%v)\n", cmd, lagText(lag), werr)
	return db, path, nil
}

// noStore says that a read-only command found no store, and what makes one.
// openStoreToRead is readAgentDB for a command that needs a store: where
// there is none, the error says so.
func openStoreToRead(ctx context.Context, stdio Stdio, cmd, dataDir string, search bool) (*agentdb.AgentStore, error) {
	db, path, err := readAgentDB(ctx, stdio, cmd, dataDir, search)
	if err != nil {
		return nil, err
	}
	if db == nil {
		return nil, errors.New(noStore(path))
	}
	return db, nil
}

func noStore(path string) string {
	return fmt.Sprintf("no store at %s: nothing captured there yet (calltap dev or calltap listen creates it; --data DIR reads another)", path)
}

func relayDB(ctx context.Context, dataDir string, opts ...storage.Option) (*relaydb.Store, error) {
	return relaydb.Open(ctx, filepath.Join(dataDir, "relay.db"), opts...)
}

// lagText says what a read of a store lagging by lag leaves out.
func lagText(lag agentdb.Lag) string {
	var left []string
	if lag.Requests > 0 {
		left = append(left, fmt.Sprintf("%d request(s)", lag.Requests))
	}
	if lag.Answers > 0 {
		left = append(left, fmt.Sprintf("%d handler answer(s)", lag.Answers))
	}
	if len(left) > 0 {
		left = []string{strings.Join(left, " and ") + " the last agent logged but did not apply"}
	}
	if lag.Unindexed > 0 {
		left = append(left, fmt.Sprintf("%d capture(s) the search index lacks", lag.Unindexed))
	}
	return strings.Join(left, ", and ")
}
