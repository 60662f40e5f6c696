package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// cmdHandler runs the small local handler both setups forward to: it reads
// the whole body and answers 200 with a short JSON body, like a webhook
// handler that accepts an event. GET /_count tells how many it served.
func cmdHandler(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("handler", flag.ContinueOnError)
	addr := fs.String("listen", "127.0.0.1:0", "address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	var served atomic.Int64
	reply := []byte(`{"received":true}`)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/_count" {
			io.WriteString(w, strconv.FormatInt(served.Load(), 10))
			return
		}
		io.Copy(io.Discard, r.Body)
		served.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(reply)))
		w.Write(reply)
	})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	fmt.Printf("listening http://%s\n", ln.Addr())
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		return err
	}
	return nil
}
