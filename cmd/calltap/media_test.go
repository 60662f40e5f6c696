package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func runMedia(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := cmdMedia(ctx, args, Stdio{In: strings.NewReader(""), Out: &out, Err: &errb})
	return code, out.String(), errb.String()
}

func TestMediaCommand(t *testing.T) {
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/files/rec.ogg":
			w.Header().Set("Content-Type", "audio/ogg")
			io.WriteString(w, "OggS recording")
			return
		case r.URL.Path == "/files/t.json":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"turns":[]}`)
			return
		case r.Header.Get("Authorization") != "Bearer K":
			w.WriteHeader(401)
			io.WriteString(w, `{"status":false,"message":"bad key","data":null,"error":{"code":"unauthorized","message":"bad key"}}`)
			return
		case r.URL.Path == "/api/v1/ext/call_logs/c1/media/":
			json.NewEncoder(w).Encode(map[string]any{"status": true, "message": "ok", "error": nil, "data": map[string]any{
				"recording_url": srv.URL + "/files/rec.ogg?sig=fresh", "transcript_url": srv.URL + "/files/t.json?sig=fresh", "expires_in": 300}})
			return
		}
		w.WriteHeader(404)
		io.WriteString(w, `{"status":false,"message":"not found","data":null,"error":{"code":"not_found","message":"not found"}}`)
	}))
	defer srv.Close()
	base := srv.URL + "/api/v1/ext/"
	data := t.TempDir()

	t.Setenv("CALLTAP_API_KEY", "K")
	code, stdout, stderr := runMedia(t, "c1", "--base-url", base, "--data", data, "--allow-private", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var files []struct {
		Kind   string `json:"kind"`
		Status string `json:"status"`
		ID     string `json:"id"`
		SHA256 string `json:"sha256"`
	}
	if err := json.Unmarshal([]byte(stdout), &files); err != nil || len(files) != 2 {
		t.Fatalf("%v: %s", err, stdout)
	}
	for _, f := range files {
		if f.Status != "saved" || f.SHA256 == "" {
			t.Errorf("%+v", f)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(data, "media"))
	if len(entries) != 2 {
		t.Errorf("%d files in the media folder", len(entries))
	}

	// The same links again: already saved, nothing fetched.
	if code, _, stderr := runMedia(t, "c1", "--base-url", base, "--data", data); code != 0 {
		t.Errorf("again: exit %d %q", code, stderr)
	}
	// Without --allow-private, links to loopback are refused: exit 1.
	if code, _, stderr := runMedia(t, "c1", "--base-url", base, "--data", t.TempDir()); code != 1 || !strings.Contains(stderr, "2 of 2") {
		t.Errorf("private: exit %d %q", code, stderr)
	}
	if code, _, stderr := runMedia(t, "nope", "--base-url", base, "--data", data); code != 1 || stderr == "" {
		t.Errorf("unknown call: exit %d %q", code, stderr)
	}
	t.Setenv("CALLTAP_API_KEY", "wrong")
	if code, _, stderr := runMedia(t, "c1", "--base-url", base, "--data", data); code != 1 || !strings.Contains(stderr, "401") {
		t.Errorf("wrong key: exit %d %q", code, stderr)
	}
	t.Setenv("CALLTAP_API_KEY", "")
	t.Setenv("CALLTAP_BASE_URL", "")
	for _, args := range [][]string{
		{"c1", "--base-url", base},
		{"--base-url", base},
		{"c1"},
		{"c1", "c2", "--base-url", base},
	} {
		if code, _, stderr := runMedia(t, args...); code != 2 || strings.Count(strings.TrimRight(stderr, "\n"), "\n") != 0 {
			t.Errorf("%v: exit %d %q", args, code, stderr)
		}
	}
}
