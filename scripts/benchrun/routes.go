package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The routes part: `calltap routes check` (a route file's what-if over
// every stored capture) on a store of 10⁵ captures, timed as a user meets
// it: the built binary, from start to exit.

// routeCount is the routes in the file the part checks.
const routeCount = 10

func cmdRoutes(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("routes", flag.ContinueOnError)
	bin := fs.String("bin", "bin/calltap", "the calltap binary")
	out := fs.String("out", "", "results file")
	size := fs.Int("size", 100_000, "captures in the store checked")
	runs := fs.Int("runs", 3, "times routes check is run; the median is reported")
	cache := addCacheFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	dataDir, err := checkStore(ctx, *cache.repo, *cache.dir, *size, *cache.batch)
	if err != nil {
		return err
	}
	res, err := openResults(*out)
	if err != nil {
		return err
	}
	defer res.close()
	file, err := writeRoutesFile("", benchRoutes())
	if err != nil {
		return err
	}
	defer os.Remove(file)
	times, err := timeRoutesCheck(ctx, *bin, file, dataDir, *size, max(*runs, 1))
	if err != nil {
		return err
	}
	med := times[len(times)/2]
	res.add(row{Measure: fmt.Sprintf("routes check: %s captures, %d routes (the whole process, --json; median of %d)", fmtCount(*size), routeCount, len(times)),
		Calltap: fmtDur(med) + " (max " + fmtDur(times[len(times)-1]) + ")", Target: "≤ 10 s", Met: verdict(med <= 10*time.Second)})
	return nil
}

// timeRoutesCheck runs `calltap routes check` runs times and returns how
// long each took, sorted. A run that fails, or does not report every
// capture, is an error: its time would measure something else.
func timeRoutesCheck(ctx context.Context, bin, file, dataDir string, size, runs int) ([]time.Duration, error) {
	var times []time.Duration
	for range runs {
		cmd := exec.CommandContext(ctx, bin, "routes", "check", file, "--data", dataDir, "--json")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		t0 := time.Now()
		out, err := cmd.Output()
		el := time.Since(t0)
		if err != nil {
			return nil, fmt.Errorf("%s routes check: %v: %s", bin, err, stderr.String())
		}
		var report struct {
			Captures int            `json:"captures"`
			Routes   map[string]int `json:"routes"`
		}
		if err := json.Unmarshal(out, &report); err != nil {
			return nil, fmt.Errorf("routes check --json: %v", err)
		}
		if report.Captures != size {
			return nil, fmt.Errorf("routes check ran over %d captures, want %d", report.Captures, size)
		}
		fmt.Fprintf(os.Stderr, "routes: %s (%v)\n", fmtDur(el), report.Routes)
		times = append(times, el)
	}
	slices.Sort(times)
	return times, nil
}

// writeRoutesFile writes a route file's contents to a new file in dir
// ("" for the temporary directory), which the caller removes, and returns
// its path.
func writeRoutesFile(dir, contents string) (string, error) {
	f, err := os.CreateTemp(dir, "calltap-bench-routes-*.toml")
	if err != nil {
		return "", err
	}
	_, err = f.WriteString(contents)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// benchRoutes is a file of routeCount routes over the synthetic store's
// events (pastCaptures): the routes no event takes (otherRoutes), then one
// that takes the calls of Denver, so that Match reads the body and tries
// most routes before one takes a capture or none does.
func benchRoutes() string {
	return otherRoutes() + fmt.Sprintf("[[route]]\nname = \"denver\"\nevents = [\"call.*\"]\nmatch = { \"call.contact.custom_fields.city\" = \"Denver\" }\nforward-to = \"http://127.0.0.1:%d\"\n", 3001+routeCount)
}

// otherRoutes are the first routeCount-1 routes of the bench's route
// files, as a team's might be: matches on body fields (a lead in
// call.variables; a city and a plan in the contact's custom fields, with
// a path) and on event kinds with a header. None takes a request of the
// cost part's load (a call.ended of lead L-1001, an Austin contact on the
// trial plan, no X-Team header) or a Denver call's event of the
// synthetic store; the ports they forward to are never dialled.
func otherRoutes() string {
	var b strings.Builder
	for i := range routeCount - 1 {
		port := 3001 + i
		switch i % 3 {
		case 0:
			fmt.Fprintf(&b, "[[route]]\nname = \"lead%d\"\nmatch = { \"call.variables.lead_id\" = \"L-%d\" }\nforward-to = \"http://127.0.0.1:%d\"\n\n", i, 1000*(i+1), port)
		case 1:
			fmt.Fprintf(&b, "[[route]]\nname = \"kind%d\"\nevents = [\"call.recording_*\"]\nheader = { \"X-Team\" = \"t%d\" }\nforward-to = \"http://127.0.0.1:%d\"\n\n", i, i, port)
		default:
			fmt.Fprintf(&b, "[[route]]\nname = \"city%d\"\nmatch = { \"call.contact.custom_fields.city\" = %q, \"call.contact.custom_fields.plan\" = \"pro\" }\npath = \"/voice\"\nforward-to = \"http://127.0.0.1:%d\"\n\n",
				i, cities[i%len(cities)], port)
		}
	}
	return b.String()
}

// checkStore returns a data directory whose agent.db holds size captures
// of past calls, built once and kept under cacheDir as routes-KEY (keyed as
// bigStore's store is). It is a store of its own, not bigStore's at 10⁶:
// calltap opens a data directory's agent.db, and the target is for 10⁵.
func checkStore(ctx context.Context, repo, cacheDir string, size, batch int) (string, error) {
	key, err := storeKey(repo, size)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cacheDir, "routes-"+key)
	if _, err := os.Stat(filepath.Join(dir, "agent.db")); err == nil {
		fmt.Fprintf(os.Stderr, "routes: using cached %s\n", dir)
		return dir, nil
	}
	// Stores of older schemas, and a build cut short, are dead weight.
	old, _ := filepath.Glob(filepath.Join(cacheDir, "routes-*"))
	for _, d := range old {
		os.RemoveAll(d)
	}
	building := filepath.Join(cacheDir, "routes-building-"+key)
	if err := os.MkdirAll(building, 0o755); err != nil {
		return "", err
	}
	fmt.Fprintf(os.Stderr, "routes: building %d captures in %s (once; kept for later runs)\n", size, dir)
	if err := buildStore(ctx, filepath.Join(building, "agent.db"), size, batch); err != nil {
		return "", err
	}
	return dir, os.Rename(building, dir)
}
