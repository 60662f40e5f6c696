package inspector

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/calltap/calltap/inspector/voice/callevent"
)

const fuzzHeader = `{"format":"calltap-export","version":1,"exported_at":"2026-11-22T10:00:00.000000Z","masked_headers":[],"redacted_paths":[]}`

// fuzzSeeds are export files: good ones, and some of what import refuses.
var fuzzSeeds = []string{
	fuzzHeader + "\n" + `{"id":"0193a1b2-0000-7000-8000-000000000001","created_at":"2026-11-22T10:00:00.000000Z","method":"POST","path":"/hooks","query":"a=1",` +
		`"request_headers":[["Content-Type","application/json"],["WA==","6XTp","base64"]],"body":"{\"event\":\"call.started\",\"call\":{\"call_id\":\"6f1c1c7e-2b7e-4f52-a0a4-5b0d1f7e9c00\"}}","body_encoding":"utf8",` +
		`"status":"delivered","response_status":200,"response_headers":[],"response_body":"/w==","response_body_encoding":"base64","duration_ms":1.5,"attempts":1,"max_attempts":1,` +
		`"attempt_log":[{"n":1,"at":"2026-11-22T10:00:00.001000Z","response_status":200,"error":"","duration_ms":1.5}]}` + "\n",
	fuzzHeader + "\n" + `{"id":"0193a1b2-0000-7000-8000-000000000002","created_at":"2026-11-22T10:00:00Z","method":"PUT","path":"L2JpbvA=","path_encoding":"base64","query":"cT3p","query_encoding":"base64","target":"http://127.0.0.1:3000/bin","body":"/wCA","body_encoding":"base64","error":"refused"}` + "\n",
	fuzzHeader + "\n" + `{"id":"0193a1b2-0000-7000-8000-000000000005","created_at":"2026-11-22T10:00:00Z","method":"POST","path":"/hooks","route":"quiet","status":"stored"}` + "\n",
	fuzzHeader + "\n" + `{"id":"0193a1b2-0000-7000-8000-000000000006","created_at":"2026-11-22T10:00:01Z","method":"POST","path":"/hooks","route":"a route\u0000"}` + "\n",
	fuzzHeader + "\n" + `{"id":"../../x'; DROP TABLE captures;--","created_at":"2026-11-22T10:00:00Z","method":"POST","path":"/"}`,
	fuzzHeader + "\n" + `{"id":"0193a1b2-0000-7000-8000-000000000003","created_at":"9999-12-31T00:00:00Z","method":"POST","path":"/","response_status":99999}`,
	fuzzHeader + "\n" + "{\"id\":\"0193a1b2-0000-7000-8000-000000000004\",\"path\":\"/\xff\"}",
	"",
	"\n\n",
}

// FuzzImport feeds ReadExport any bytes. It must not panic; what it takes
// must hold the forms and ranges calltap writes, and must come back the
// same through an export and a second read (every byte of it).
func FuzzImport(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ef, err := ReadExport(bytes.NewReader(b))
		if err != nil {
			var ie *ImportError
			if errors.As(err, &ie) && (ie.Line < 1 || !strings.HasPrefix(err.Error(), fmt.Sprintf("line %d: ", ie.Line))) {
				t.Fatalf("an error naming no line: %v", err)
			}
			return
		}
		var again bytes.Buffer
		again.WriteString(fuzzHeader + "\n")
		enc := json.NewEncoder(&again)
		for _, c := range ef.Captures {
			if !callevent.IsUUID(c.ID) || (c.ResponseStatus != 0 && (c.ResponseStatus < 100 || c.ResponseStatus > 599)) ||
				c.CreatedAt.Before(earliestCapture) || !strings.HasPrefix(c.Path, "/") {
				t.Fatalf("took %+v", c.Capture)
			}
			if err := enc.Encode(exportLineOf(c.Capture, c.Attempts)); err != nil {
				t.Fatal(err)
			}
		}
		ef2, err := ReadExport(&again)
		if err != nil {
			t.Fatalf("its own export of what it took is refused: %v\n%s", err, again.Bytes())
		}
		if len(ef2.Captures) != len(ef.Captures) {
			t.Fatalf("%d captures came back of %d", len(ef2.Captures), len(ef.Captures))
		}
		for i, c := range ef.Captures {
			if !reflect.DeepEqual(c, ef2.Captures[i]) {
				t.Fatalf("a capture changed through an export:\n%+v\n%+v", *c.Capture, *ef2.Captures[i].Capture)
			}
		}
	})
}

// Each field is checked for its form and range, and the error names the
// line and the field.
func TestImportChecksEachField(t *testing.T) {
	good := `{"id":"0193a1b2-0000-7000-8000-000000000001","created_at":"2026-11-22T10:00:00Z","method":"POST","path":"/hooks"}`
	if _, err := ReadExport(strings.NewReader(fuzzHeader + "\n" + good + "\n")); err != nil {
		t.Fatalf("a good line: %v", err)
	}
	for _, tc := range []struct{ edit, want string }{
		{`"id":"../../x'; DROP TABLE captures;--\u0000"`, "line 2: id:"},
		{`"id":"` + strings.Repeat("a", 5<<20) + `"`, "line 2: id:"},
		{`"response_status":99999`, "line 2: response_status: 99999"},
		{`"response_status":99`, "line 2: response_status: 99"},
		{`"created_at":"9999-12-31T00:00:00Z"`, "line 2: created_at:"},
		{`"created_at":"1970-01-01T00:00:00Z"`, "line 2: created_at:"},
		{`"delivered_at":"tomorrow"`, "line 2: delivered_at:"},
		{`"method":"PO ST"`, "line 2: method:"},
		{`"path":"hooks"`, "line 2: path:"},
		{`"path":"/a\u0000b"`, "line 2: path:"},
		{`"query":"a=\n"`, "line 2: query:"},
		{`"target":"file:///etc/passwd"`, "line 2: target:"},
		{`"status":"lost"`, "line 2: status:"},
		{`"route":"alice; DROP TABLE captures"`, "line 2: route:"},
		{`"route":"a\u0000"`, "line 2: route:"},
		{`"route":"` + strings.Repeat("r", 2<<10) + `"`, "line 2: route:"},
		{`"attempts":-1`, "line 2: attempts:"},
		{`"duration_ms":-5`, "line 2: duration_ms:"},
		{`"duration_ms":1e300`, "line 2: duration_ms:"},
		{`"replay_of":"x"`, "line 2: replay_of:"},
		{`"request_headers":[["Bad Name","v"]]`, "line 2: request_headers: field 1"},
		{`"request_headers":[["X-A","a\r\nInjected: 1"]]`, "line 2: request_headers: field 1"},
		{`"body":"!!","body_encoding":"base64"`, "line 2: body:"},
		{`"body":"x","body_encoding":"rot13"`, "line 2: body: unknown encoding"},
		{`"attempt_log":[{"n":2,"at":"2026-11-22T10:00:00Z","duration_ms":1}]`, "line 2: attempt_log[0]: n:"},
		{`"attempt_log":[{"n":1,"at":"2026-11-22T10:00:00Z","response_status":700,"duration_ms":1}]`, "line 2: attempt_log[0]: response_status:"},
	} {
		// A repeated key's last value counts: the edit goes last.
		line := strings.TrimSuffix(good, "}") + "," + tc.edit + "}"
		_, err := ReadExport(strings.NewReader(fuzzHeader + "\n" + line + "\n"))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) || len(err.Error()) > 300 {
			msg := "<nil>"
			if err != nil {
				msg = err.Error()[:min(len(err.Error()), 300)]
			}
			t.Errorf("%.60s: %s, want %q…", tc.edit, msg, tc.want)
		}
	}
	// Bytes that are not UTF-8 are refused, not turned into U+FFFD.
	_, err := ReadExport(strings.NewReader(fuzzHeader + "\n" + strings.Replace(good, "/hooks", "/ho\xffks", 1) + "\n"))
	if err == nil || !strings.HasPrefix(err.Error(), "line 2: not UTF-8") {
		t.Errorf("a path with a byte that is not UTF-8: %v", err)
	}
}

// A line too long is named by its number, whichever it is.
func TestImportNamesTheLineTooLong(t *testing.T) {
	long := fuzzHeader + "\n" + strings.Repeat("x", maxExportLine+10) + "\n"
	_, err := ReadExport(strings.NewReader(long))
	if err == nil || err.Error() != "line 2 is longer than 64 MiB: not a calltap export, or damaged" {
		t.Errorf("a 64 MiB second line: %v", err)
	}
	_, err = ReadExport(bytes.NewReader(make([]byte, maxExportLine+10)))
	if err == nil || !strings.HasPrefix(err.Error(), "line 1 is longer than 64 MiB") {
		t.Errorf("zeros without a newline: %v", err)
	}
}
