package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"text/tabwriter"

	"github.com/calltap/calltap/inspector"
	"github.com/calltap/calltap/inspector/agent/mediasave"
	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/inspector/voice/service"
	"github.com/calltap/calltap/storage"
	"github.com/calltap/calltap/storage/agentdb"
)

func cmdMedia(ctx context.Context, args []string, stdio Stdio) int {
	fs := newFlagSet("media", "calltap media CALL_ID [--base-url URL] [--data DIR] [--json]",
		"Ask the voice service for fresh links to a call's recording and transcript\n"+
			"(GET /call_logs/{id}/media/) and save the files in the data directory, where the\n"+
			"inspector serves them. The address and key are found as for 'calltap service'.")
	var sf serviceFlags
	sf.register(fs)
	var (
		dataDir      = fs.String("data", defaultDataDir(), "data `dir`ectory")
		allowPrivate = fs.Bool("allow-private", false, "allow links to loopback and private addresses (the emulator)")
		asJSON       = fs.Bool("json", false, "print the saved files' records as JSON")
	)
	if ok, code := parseFlags(fs, args, stdio); !ok {
		return code
	}
	if len(fs.args) != 1 {
		return usageError(stdio, "media", "want one CALL_ID")
	}
	callID := fs.args[0]
	client, err := sf.client(stdio, "media")
	if err != nil {
		return usageError(stdio, "media", "%v", err)
	}
	links, err := mediaLinks(ctx, client, callID)
	if err != nil {
		return fail(stdio, "media", err)
	}
	db, err := agentDB(ctx, *dataDir)
	if err != nil {
		return fail(stdio, "media", err)
	}
	defer db.Close()
	files, err := saveMedia(ctx, db, *dataDir, *allowPrivate, callID, links)
	if err != nil {
		return fail(stdio, "media", err)
	}
	if *asJSON {
		out := make([]inspector.MediaFileJSON, len(files))
		for i, f := range files {
			out[i] = inspector.MediaFileOf(f)
		}
		enc := json.NewEncoder(stdio.Out)
		enc.SetIndent("", "  ")
		enc.Encode(out)
	} else {
		printMedia(stdio.Out, *dataDir, files)
	}
	failed := 0
	for _, f := range files {
		if f.Status != agentdb.MediaSaved {
			failed++
		}
	}
	if failed > 0 {
		fmt.Fprintf(stdio.Err, "calltap media: %d of %d files not saved\n", failed, len(files))
		return 1
	}
	return 0
}

// mediaLinks asks the service for fresh links to a call's media: in the
// documented fields, or found in the answer's raw JSON.
func mediaLinks(ctx context.Context, client *service.Client, callID string) (callevent.Media, error) {
	m, err := client.Media(ctx, callID)
	if err != nil {
		return callevent.Media{}, err
	}
	links := callevent.Media{RecordingURL: m.RecordingURL, TranscriptURL: m.TranscriptURL, ExpiresIn: m.ExpiresIn}
	if links.RecordingURL == "" && links.TranscriptURL == "" {
		links = mediasave.ParseLinks(m.Raw)
	}
	if links.RecordingURL == "" && links.TranscriptURL == "" {
		return links, fmt.Errorf("the service's answer holds no media link: %.300s", m.Raw)
	}
	return links, nil
}

// saveMedia downloads the files links name into the data directory and
// returns their records.
func saveMedia(ctx context.Context, db *agentdb.AgentStore, dataDir string, allowPrivate bool, callID string, links callevent.Media) ([]*agentdb.MediaFile, error) {
	saver, err := mediasave.New(mediasave.Config{DB: db, Dir: filepath.Join(dataDir, "media"), AllowPrivate: allowPrivate})
	if err != nil {
		return nil, err
	}
	saver.Save(ctx, "", callID, links)
	saver.Wait()
	var files []*agentdb.MediaFile
	for _, u := range []string{links.RecordingURL, links.TranscriptURL} {
		if u == "" {
			continue
		}
		rows, _, err := db.MediaFiles(ctx, agentdb.MediaFilter{SourceURL: u, Page: storage.Page{Limit: 1}})
		if err != nil {
			return nil, err
		}
		files = append(files, rows...)
	}
	return files, nil
}

func printMedia(w io.Writer, dataDir string, files []*agentdb.MediaFile) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tSTATUS\tSIZE\tSHA256\tFILE")
	for _, f := range files {
		where := filepath.Join(dataDir, "media", f.File)
		if f.Status != agentdb.MediaSaved {
			where = f.Error
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", f.Kind, f.Status, f.Size, f.SHA256, where)
	}
	tw.Flush()
}
