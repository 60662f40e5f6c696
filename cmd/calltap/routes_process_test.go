package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/storage/agentdb"
)

// These tests run routes end to end: a relay, an agent (calltap listen)
// and three handler processes (scripts/samplehandler), as a developer
// would with a route file.

var sampleBuilt = &builtBinary{pkg: "../../scripts/samplehandler"}

// handlerProc is a sample handler process; got lists the event ids it
// answered, in the order it answered them.
type handlerProc struct {
	url string
	out *syncBuffer
}

var answeredLine = regexp.MustCompile(`(?m) (\S+) (\S+): 200$`)

func startHandlerProc(t *testing.T, args ...string) *handlerProc {
	t.Helper()
	addr := freeAddr(t)
	cmd := exec.Command(sampleBuilt.get(t), append([]string{"--listen", addr}, args...)...)
	h := &handlerProc{url: "http://" + addr, out: &syncBuffer{}}
	cmd.Stdout, cmd.Stderr = h.out, h.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	polltest.Until(t, 20*time.Second, func() bool {
		resp, err := http.Get(h.url + "/media/none")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	}, "the sample handler did not start")
	return h
}

func (h *handlerProc) got() []string {
	var ids []string
	for _, m := range answeredLine.FindAllStringSubmatch(h.out.String(), -1) {
		ids = append(ids, m[2])
	}
	return ids
}

// routeRig is a relay and a token; listen starts an agent on it.
type routeRig struct {
	t        *testing.T
	relayURL string
	token    string
	dir      string // the agent's data directory
}

func newRouteRig(t *testing.T) *routeRig {
	relayDir := t.TempDir()
	addr := freeAddr(t)
	r := &routeRig{t: t, relayURL: "http://" + addr, dir: t.TempDir()}
	start(t, "relay", "--listen", addr, "--insecure-http", "--public-url", r.relayURL, "--data", relayDir)
	code, stdout, stderr := runCmd(t, "relay", "token", "create", "dev", "--data", relayDir, "--public-url", r.relayURL)
	if code != 0 {
		t.Fatalf("token create: %s", stderr)
	}
	r.token = regexp.MustCompile(`ct_\S+`).FindString(stdout)
	return r
}

// listen starts calltap listen with args added and waits for its tunnel.
func (r *routeRig) listen(args ...string) (*proc, string) {
	p := start(r.t, append([]string{"listen", "--relay", r.relayURL, "--token", r.token, "--inspect", "", "--data", r.dir}, args...)...)
	return p, tunnelURL(r.t, p)
}

// stop stops an agent as Ctrl-C does.
func (r *routeRig) stop(p *proc) {
	r.t.Helper()
	p.cmd.Process.Signal(syscall.SIGINT)
	if code := exitWithin(r.t, p, httpGrace+time.Minute, "listen"); code != 0 {
		r.t.Fatalf("listen: exit status %d after SIGINT", code)
	}
}

// routesOf reads the route each capture took, by delivery id, from the
// stopped agent's store.
func (r *routeRig) routesOf() map[string]string {
	db, err := agentDB(context.Background(), r.dir)
	if err != nil {
		r.t.Fatal(err)
	}
	defer db.Close()
	cs, _, err := db.Captures(context.Background(), agentdb.CaptureFilter{Page: agentdb.Page{Limit: 100}})
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[string]string{}
	for _, c := range cs {
		out[c.DeliveryID] = c.Route + "/" + c.Status
	}
	return out
}

// routedEvent is a call event as the voice service sends it; developer, when
// set, goes in call.variables.
func routedEvent(id, kind, callID, developer string) string {
	vars := ""
	if developer != "" {
		vars = fmt.Sprintf(`,"variables":{"developer":%q}`, developer)
	}
	return fmt.Sprintf(`{"id":%q,"event":%q,"occurred_at":"2026-11-29T10:00:00Z","call":{"call_id":%q%s}}`, id, kind, callID, vars)
}

// post sends body to url and returns the status and the stored-only
// header of the answer.
func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Calltap-Stored-Only")
}

func replaceRoutes(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

const threeRoutes = `# three handlers and a quiet kind
[[route]]
name = "quiet"
events = ["call.connected"]
store-only = true

[[route]]
name = "media"
events = ["call.recording_*", "call.analysis_*"]
forward-to = "%s"

[[route]]
name = "alice"
match = { "call.variables.developer" = "alice" }
forward-to = "%s"
`

// Each event goes to the handler its route names: by kind, by a field of
// the call (which the call's later events lack, and still follow, across
// a restart of the agent), stored only, or to --forward-to, the default.
func TestRoutesSendEachEventToItsHandler(t *testing.T) {
	media, alice, other := startHandlerProc(t), startHandlerProc(t), startHandlerProc(t)
	r := newRouteRig(t)
	file := filepath.Join(t.TempDir(), "routes.toml")
	replaceRoutes(t, file, fmt.Sprintf(threeRoutes, media.url, alice.url))
	agent, url := r.listen("--routes", file, "--forward-to", other.url)

	if code, so := post(t, url, routedEvent("e1", "call.started", "ca", "alice")); code != 200 || so != "" {
		t.Fatalf("call.started: %d, stored-only %q", code, so)
	}
	if code, so := post(t, url, routedEvent("e2", "call.connected", "ca", "")); code != 200 || so != "quiet" {
		t.Fatalf("call.connected: %d, stored-only %q; want 200 from calltap, stored only by route quiet", code, so)
	}
	post(t, url, routedEvent("e3", "call.started", "cb", "bob"))
	r.stop(agent)

	// The call's later events lack call.variables: they follow its start,
	// though the agent that saw it has stopped.
	agent, url = r.listen("--routes", file, "--forward-to", other.url)
	post(t, url, routedEvent("e4", "call.ended", "ca", ""))
	post(t, url, routedEvent("e5", "call.recording_available", "ca", ""))
	post(t, url, routedEvent("e6", "call.ended", "cb", ""))
	r.stop(agent)

	for name, want := range map[*handlerProc][]string{alice: {"e1", "e4"}, media: {"e5"}, other: {"e3", "e6"}} {
		if got := name.got(); !slices.Equal(got, want) {
			t.Errorf("handler %s got %v, want %v", name.url, got, want)
		}
	}
	want := map[string]string{"e1": "alice/delivered", "e2": "quiet/stored", "e3": "default/delivered",
		"e4": "alice/delivered", "e5": "media/delivered", "e6": "default/delivered"}
	if got := r.routesOf(); !mapsEqual(got, want) {
		t.Errorf("captures' routes %v, want %v", got, want)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// --events forwards only the kinds it names; the rest are stored only.
// With a route file and no --forward-to, what no route takes is stored
// only too.
func TestEventsFilterAndNoDefaultStoreTheRest(t *testing.T) {
	media, alice, other := startHandlerProc(t), startHandlerProc(t), startHandlerProc(t)
	r := newRouteRig(t)
	agent, url := r.listen("--events", "call.started,call.analysis_*", "--forward-to", other.url)
	if code, so := post(t, url, routedEvent("f1", "call.started", "c1", "")); code != 200 || so != "" {
		t.Fatalf("call.started: %d, stored-only %q", code, so)
	}
	if code, so := post(t, url, routedEvent("f2", "call.ended", "c1", "")); code != 200 || so != "filtered" {
		t.Fatalf("call.ended: %d, stored-only %q; want stored only (filtered)", code, so)
	}
	r.stop(agent)

	file := filepath.Join(t.TempDir(), "routes.toml")
	replaceRoutes(t, file, fmt.Sprintf(threeRoutes, media.url, alice.url))
	agent, url = r.listen("--routes", file)
	if code, so := post(t, url, routedEvent("f3", "call.started", "c2", "bob")); code != 200 || so != "default" {
		t.Fatalf("no route, no --forward-to: %d, stored-only %q; want stored only (default)", code, so)
	}
	post(t, url, routedEvent("f4", "call.analysis_completed", "c2", ""))
	r.stop(agent)

	for h, want := range map[*handlerProc][]string{other: {"f1"}, media: {"f4"}, alice: nil} {
		if got := h.got(); !slices.Equal(got, want) {
			t.Errorf("handler %s got %v, want %v", h.url, got, want)
		}
	}
	want := map[string]string{"f1": "default/delivered", "f2": "filtered/stored", "f3": "default/stored", "f4": "media/delivered"}
	if got := r.routesOf(); !mapsEqual(got, want) {
		t.Errorf("captures' routes %v, want %v", got, want)
	}
}

// A changed route file is taken without a restart; a change that does not
// check is refused with one ERROR line naming the file and the line, and
// the last good routes stay.
func TestRouteFileReloads(t *testing.T) {
	media, alice, other := startHandlerProc(t), startHandlerProc(t), startHandlerProc(t)
	r := newRouteRig(t)
	file := filepath.Join(t.TempDir(), "routes.toml")
	replaceRoutes(t, file, fmt.Sprintf(threeRoutes, media.url, alice.url))
	agent, url := r.listen("--routes", file, "--forward-to", other.url)
	post(t, url, routedEvent("g1", "call.started", "c1", "alice"))

	// alice's events now go to the media handler.
	replaceRoutes(t, file, fmt.Sprintf(threeRoutes, media.url, media.url))
	polltest.Until(t, 20*time.Second, func() bool { return strings.Contains(agent.out.String(), "routes reloaded") },
		"the changed route file was not taken")
	post(t, url, routedEvent("g2", "call.ended", "c1", ""))

	// A broken change: the routes of the last good file stay.
	replaceRoutes(t, file, "[[route]]\nname = \"media\"\nforward-to = \"nope\"\n")
	polltest.Until(t, 20*time.Second, func() bool { return strings.Contains(agent.out.String(), "level=ERROR") },
		"the broken route file was not refused")
	post(t, url, routedEvent("g3", "call.ended", "c1", ""))
	r.stop(agent)

	errLine := regexp.MustCompile(`(?m)^.*level=ERROR.*$`).FindString(agent.out.String())
	if !strings.Contains(errLine, "routes.toml:") || !strings.Contains(errLine, "last good routes stay") {
		t.Errorf("the refusal does not name the file and line, or what stays: %s", errLine)
	}
	if n := strings.Count(agent.out.String(), "level=ERROR"); n != 1 {
		t.Errorf("%d ERROR lines for one broken change, want 1", n)
	}
	if got, want := alice.got(), []string{"g1"}; !slices.Equal(got, want) {
		t.Errorf("alice's handler got %v, want %v", got, want)
	}
	if got, want := media.got(), []string{"g2", "g3"}; !slices.Equal(got, want) {
		t.Errorf("the media handler got %v, want %v (the reloaded route, kept after the broken change)", got, want)
	}
}

// A route whose handler answers after 5 s holds up no other route's
// events, live or queued while the agent was away; each handler gets its
// route's events in the order they arrived.
func TestSlowRouteHoldsUpNoOther(t *testing.T) {
	media, alice, other := startHandlerProc(t, "--delay", "5s"), startHandlerProc(t), startHandlerProc(t)
	r := newRouteRig(t)
	file := filepath.Join(t.TempDir(), "routes.toml")
	replaceRoutes(t, file, fmt.Sprintf(threeRoutes, media.url, alice.url))
	agent, url := r.listen("--routes", file, "--forward-to", other.url)

	// Live: alice's events are answered while the media handler still
	// holds its first.
	slow := make(chan int, 1)
	go func() {
		code, _ := post(t, url, routedEvent("h1", "call.recording_available", "c1", ""))
		slow <- code
	}()
	polltest.Until(t, 20*time.Second, func() bool { return strings.Contains(media.out.String(), "h1: received") },
		"the media request did not reach its handler")
	for i, kind := range []string{"call.started", "call.ended"} {
		post(t, url, routedEvent(fmt.Sprint("h", 2+i), kind, "c2", "alice"))
	}
	if n := len(media.got()); n != 0 {
		t.Fatalf("alice's events waited for the slow media handler (it answered %d first)", n)
	}
	if code := <-slow; code != 200 {
		t.Fatalf("the slow route's request: %d", code)
	}
	r.stop(agent)

	// Queued while away: each route's events in their order, alice's not
	// behind media's.
	for i, ev := range []string{
		routedEvent("q1", "call.recording_available", "c3", ""),
		routedEvent("q2", "call.started", "c4", "alice"),
		routedEvent("q3", "call.analysis_completed", "c3", ""),
		routedEvent("q4", "call.ended", "c4", ""),
		routedEvent("q5", "call.started", "c5", "bob"),
		routedEvent("q6", "call.completed", "c4", ""),
	} {
		if code, _ := post(t, url, ev); code != 202 {
			t.Fatalf("event %d while away: %d, want 202 (queued)", i, code)
		}
	}
	agent, _ = r.listen("--routes", file, "--forward-to", other.url)
	polltest.Until(t, 30*time.Second, func() bool { return len(alice.got()) == 5 && len(other.got()) == 1 },
		"the queued events of alice's route and the default did not arrive")
	if n := len(media.got()); n > 1 {
		t.Errorf("the fast routes' queued events waited for the slow one: media answered %d of its queued events first", n-1)
	}
	polltest.Until(t, 60*time.Second, func() bool { return len(media.got()) == 3 }, "the slow route's queued events did not arrive")
	r.stop(agent)
	for h, want := range map[*handlerProc][]string{media: {"h1", "q1", "q3"}, alice: {"h2", "h3", "q2", "q4", "q6"}, other: {"q5"}} {
		if got := h.got(); !slices.Equal(got, want) {
			t.Errorf("handler %s got %v, want %v, in this order", h.url, got, want)
		}
	}
}
