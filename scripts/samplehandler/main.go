// Command samplehandler is the small local webhook handler `make demo`
// forwards to, and the handler the README's examples run against. It
// answers 200 with {"received":true,"id":…,"event":…} to each call event
// and prints what it received. With --fail-once KIND it answers 500 to the
// first delivery of that event kind, as a handler whose database was busy
// would, so the demo can show a failure and the replay that fixes it. It
// also serves sample recordings and transcripts under /media/, so that the
// media links of sample events point at files that exist. With --delay D
// it answers each call event D after it came: a slow handler.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

func main() {
	addr := flag.String("listen", "127.0.0.1:3000", "address to listen on")
	failOnce := flag.String("fail-once", "", "answer 500 to the first delivery of this event kind, e.g. call.analysis_completed")
	delay := flag.Duration("delay", 0, "answer each call event this long after it came, as a slow handler would")
	flag.Parse()
	h := newHandler(*failOnce, log.New(os.Stderr, "", log.LstdFlags))
	h.delay = *delay
	srv := &http.Server{Addr: *addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	log.Printf("sample handler on http://%s", *addr)
	if err := srv.ListenAndServe(); err != nil {
		log.Print(err)
		os.Exit(1)
	}
}

// handler answers call events and serves sample media.
type handler struct {
	failOnce string
	delay    time.Duration
	log      *log.Logger

	mu     sync.Mutex
	failed bool // guarded by mu: the --fail-once delivery has been failed
}

func newHandler(failOnce string, l *log.Logger) *handler { return &handler{failOnce: failOnce, log: l} }

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/media/") {
		h.media(w, r)
		return
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	var ev struct {
		ID    string `json:"id"`
		Event string `json:"event"`
	}
	json.Unmarshal(body, &ev)
	if h.delay > 0 {
		h.log.Printf("%s %s: received, answering in %s (--delay)", ev.Event, ev.ID, h.delay)
		time.Sleep(h.delay) // a slow handler, on purpose
	}
	w.Header().Set("Content-Type", "application/json")
	if h.failNow(ev.Event) {
		h.log.Printf("%s %s: 500, on purpose (--fail-once)", ev.Event, ev.ID)
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintln(w, `{"error":"database is busy"}`)
		return
	}
	h.log.Printf("%s %s: 200", ev.Event, ev.ID)
	json.NewEncoder(w).Encode(map[string]any{"received": true, "id": ev.ID, "event": ev.Event})
}

// failNow reports whether this delivery is the one to fail.
func (h *handler) failNow(event string) bool {
	if h.failOnce == "" || event != h.failOnce {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failed {
		return false
	}
	h.failed = true
	return true
}

// media serves a sample file for any /media/…/recording.* or
// /media/…/transcript.json link: a few bytes of Ogg for the recording (not
// playable audio, but a file to save) and a short transcript.
func (h *handler) media(w http.ResponseWriter, r *http.Request) {
	switch {
	case strings.HasSuffix(r.URL.Path, "/transcript.json"):
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintln(w, `{"sample":true,"turns":[{"speaker":"agent","text":"Hi, this is Ava. Is now a good time?"},{"speaker":"contact","text":"Yes, go ahead."}]}`)
	case strings.Contains(r.URL.Path, "/recording."):
		w.Header().Set("Content-Type", "audio/ogg")
		w.Write([]byte("OggS\x00\x02sample recording from scripts/samplehandler\n"))
	default:
		http.NotFound(w, r)
	}
}
