// Command samplehandler is the small local webhook handler `make demo`
// forwards to: it answers 200 to call events, 500 to one in five
// call.analysis_completed deliveries (so the inspector has failures to
// show), and prints what it received.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"sync/atomic"
	"time"
)

func main() {
	addr := flag.String("listen", "127.0.0.1:3000", "address to listen on")
	flag.Parse()
	var n atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		var ev struct {
			ID    string `json:"id"`
			Event string `json:"event"`
			Call  struct {
				CallID string `json:"call_id"`
			} `json:"call"`
		}
		json.Unmarshal(body, &ev)
		i := n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if ev.Event == "call.analysis_completed" && i%5 == 0 {
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprintln(w, `{"error":"database is busy"}`)
			return
		}
		fmt.Fprintf(w, `{"received":%q,"event":%q}`+"\n", ev.ID, ev.Event)
	})
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	log.Printf("sample handler on http://%s", *addr)
	log.Fatal(srv.ListenAndServe())
}
