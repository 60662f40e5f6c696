package inspector

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/storage/agentdb"
)

// An export is JSON Lines: a first line naming the format and its version
// and what the export left out, then one capture a line, oldest first, each
// the inspector API's detail of that capture. Every line is UTF-8: a body,
// header, path, query, target or error that is not is carried in base64,
// flagged by its *_encoding field (or a header's third element), so that an
// import gives back every byte.
const (
	ExportFormat  = "calltap-export"
	ExportVersion = 1
)

// ExportHeader is an export's first line.
type ExportHeader struct {
	Format     string `json:"format"`
	Version    int    `json:"version"`
	ExportedAt string `json:"exported_at"`
	// The headers whose values were replaced by MaskedValue, in requests
	// and answers; empty when the export keeps secrets.
	MaskedHeaders []string `json:"masked_headers"`
	// The JSON paths of the bodies whose values were replaced by
	// stand-ins (export --redact); empty when none were.
	RedactedPaths []string `json:"redacted_paths"`
}

// exportLine is a capture as an export writes it: its API detail, with
// the text fields that are not UTF-8 in base64.
type exportLine struct {
	Detail
	PathEncoding   string `json:"path_encoding,omitempty"`
	QueryEncoding  string `json:"query_encoding,omitempty"`
	TargetEncoding string `json:"target_encoding,omitempty"`
	ErrorEncoding  string `json:"error_encoding,omitempty"`
}

// exportEvery is how often an export reports its progress, in captures.
const exportEvery = 1000

// header is the first line of an export made with o.
func (o *ExportOptions) header() ExportHeader {
	h := ExportHeader{Format: ExportFormat, Version: ExportVersion, ExportedAt: api.FormatTime(time.Now()),
		MaskedHeaders: append([]string{}, o.Mask...), RedactedPaths: []string{}}
	if o.Redactor != nil {
		h.RedactedPaths = o.Redactor.Paths()
	}
	return h
}

// Export writes the captures o selects (its Filter's Page aside) to w as
// JSON Lines, oldest first, and returns how many it wrote.
func Export(ctx context.Context, db *agentdb.AgentStore, o ExportOptions, w io.Writer) (int, error) {
	if err := o.learn(ctx, db); err != nil {
		return 0, err
	}
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	if err := enc.Encode(o.header()); err != nil {
		return 0, err
	}
	n, err := eachCapture(ctx, db, o.Filter, o.Progress, func(c *agentdb.Capture) error {
		attempts, err := db.Attempts(ctx, c.ID)
		if err != nil {
			return err
		}
		if c, err = o.clean(c); err != nil {
			return err
		}
		return enc.Encode(exportLineOf(c, attempts))
	})
	if err != nil {
		return n, err
	}
	return n, bw.Flush()
}

// learn shows the Redactor every body of the export before any is
// written, so that a value is replaced in a capture that comes before the
// one whose personal field holds it.
func (o *ExportOptions) learn(ctx context.Context, db *agentdb.AgentStore) error {
	if o.Redactor == nil {
		return nil
	}
	_, err := db.EachCapture(ctx, o.Filter, func(c *agentdb.Capture) error {
		o.Redactor.Learn(c.Body)
		o.Redactor.Learn(c.ResponseBody)
		return nil
	})
	return err
}

func exportLineOf(c *agentdb.Capture, attempts []agentdb.Attempt) exportLine {
	l := exportLine{Detail: detailOf(c, attempts, nil)}
	l.Checks = checksOf(c)
	for _, f := range []struct {
		field, encoding *string
	}{{&l.Path, &l.PathEncoding}, {&l.Query, &l.QueryEncoding}, {&l.Target, &l.TargetEncoding}, {&l.Error, &l.ErrorEncoding}} {
		if !utf8.ValidString(*f.field) {
			*f.field, *f.encoding = base64.StdEncoding.EncodeToString([]byte(*f.field)), "base64"
		}
	}
	l.URL = escapeInvalidUTF8(l.URL)
	return l
}

// escapeInvalidUTF8 writes the bytes of a URL that are not UTF-8 as %XX,
// as a URL carries them, instead of the U+FFFD JSON would make of them.
func escapeInvalidUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			fmt.Fprintf(&b, "%%%02X", s[i])
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// eachCapture is the store's EachCapture, telling progress the count so
// far every exportEvery captures and at the end.
func eachCapture(ctx context.Context, db *agentdb.AgentStore, f agentdb.CaptureFilter, progress func(int), fn func(*agentdb.Capture) error) (int, error) {
	n := 0
	_, err := db.EachCapture(ctx, f, func(c *agentdb.Capture) error {
		if err := fn(c); err != nil {
			return err
		}
		n++
		if progress != nil && n%exportEvery == 0 {
			progress(n)
		}
		return nil
	})
	if progress != nil && n%exportEvery != 0 {
		progress(n)
	}
	return n, err
}
