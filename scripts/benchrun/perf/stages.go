package perf

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/calltap/calltap/scripts/benchrun/load"
)

// A profile: perf record under load, each sample put down to a stage of
// the relay's or the agent's work.

// The stages of a request in each process. A sample belongs to the stage
// of the first frame, from the leaf outwards, that one of its patterns
// matches ("^x": the symbol starts with x; else it contains x); the rules
// of a process are tried in order on each frame. A rule with cLeaf also
// takes the samples whose innermost frame in user space is C code (the
// program's own or a shared library's): C code keeps no frame pointers,
// so the chain above it is lost.
type stageRule struct {
	stage    string
	patterns []string
	cLeaf    bool
}

// frame is one line of a sample's call stack.
type frame struct {
	sym, dso string
}

func (f frame) kernel() bool {
	return f.dso == "[kernel.kallsyms]" || strings.HasPrefix(f.dso, "[kernel")
}

func (f frame) unknown() bool { return f.sym == "[unknown]" || f.dso == "[unknown]" || f.sym == "" }

// cCode tells a frame of C code: a shared library's, or a function of the
// program without the dot of a Go name (gcc's clones: name.isra.0).
func (f frame) cCode() bool {
	if f.kernel() || f.unknown() || strings.HasPrefix(f.dso, "[") || goAsm[f.sym] { // [vdso]: the runtime's clock
		return false
	}
	if strings.Contains(f.dso, ".so") {
		return true
	}
	for _, clone := range []string{".isra.", ".constprop.", ".part.", ".cold"} {
		if strings.Contains(f.sym, clone) {
			return true
		}
	}
	return !strings.Contains(f.sym, ".")
}

// goAsm are the Go assembly functions named without a package.
var goAsm = map[string]bool{"indexbytebody": true, "memeqbody": true, "cmpbody": true, "countbody": true, "indexbody": true,
	"aeshashbody": true, "gogo": true}

// goCode tells a frame of the program's Go code outside the runtime.
func (f frame) goCode() bool {
	if f.kernel() || f.unknown() || strings.HasPrefix(f.dso, "[") || f.cCode() {
		return false
	}
	for _, p := range []string{"runtime.", "internal/", "syscall.", "sync.", "sync/atomic.", "gcBgMarkWorker"} {
		if strings.HasPrefix(f.sym, p) {
			return false
		}
	}
	return true
}

// wsReads are the websocket's reads, under readFrame (batchConn wraps the
// connection both ways).
var wsReads = []string{"gorilla/websocket.(*Conn).NextReader", "gorilla/websocket.(*Conn).advanceFrame",
	"gorilla/websocket.(*messageReader)", "gorilla/websocket.(*Conn).read", "relay.(*batchConn).Read", "relay.(*batchConn).SetReadDeadline"}

var agentStages = []stageRule{
	{stage: "read frame", patterns: append([]string{"relay.(*clientConn).readLoop", "relay.(*wsConn).readFrame", "relay.readFrame",
		"relay.decodeRequest"}, wsReads...)},
	// The agent's only C code is SQLite's, and only SQLite calls libc:
	// C code at the leaf is saving.
	{stage: "save", patterns: []string{"github.com/calltap/calltap/storage.", "github.com/calltap/calltap/storage/agentdb.", "github.com/calltap/calltap/storage/intake.",
		"github.com/mattn/go-sqlite3",
		"inspector/agent.(*committer).", "inspector/agent.(*Agent).write", "inspector/agent.(*Agent).record",
		"^sqlite3", "^pager", "^wal", "^btree", "^pcache", "^vdbe", "^_cgo_", "^x_cgo_",
		"^__x64_sys_fdatasync", "^__x64_sys_fsync", "^__x64_sys_pwrite64", "^__x64_sys_pread64", "^ext4_sync_file", "^jbd2"},
		cLeaf: true},
	{stage: "forward", patterns: []string{"inspector/agent.(*Agent).send", "inspector/agent.(*handlerClient)", "inspector/agent.(*handlerConn)"}},
	{stage: "answer", patterns: []string{"relay.(*Stream).Respond", "relay.(*Stream).Ack", "relay.(*Stream).Release", "relay.(*wsConn).",
		"relay.(*batchConn).", "relay.(*clientConn).send",
		"gorilla/websocket.(*Conn).Write", "gorilla/websocket.(*Conn).Next", "gorilla/websocket.(*messageWriter)", "gorilla/websocket.(*Conn).write"}},
	{stage: "console line", patterns: []string{"inspector/agent.(*Agent).printLine", "inspector/agent.(*console)"}},
}

var relayStages = []stageRule{
	{stage: "read frame", patterns: append([]string{"relay.(*agentConn).readLoop", "relay.(*wsConn).readFrame", "relay.decodeResponse",
		"relay.decodeAck"}, wsReads...)},
	{stage: "answer", patterns: []string{"relay.(*Server).writeAnswer", "net/http.(*response).", "net/http.(*chunkWriter).",
		"net/http.(*conn).finalFlush"}},
	{stage: "parse", patterns: []string{"net/http.(*conn).readRequest", "net/http.readRequest", "net/textproto.", "net/http.(*connReader).",
		"net/http.(*body).", "relay.(*Server).readBody", "relay.(*bodyPacer)", "net/http.(*conn).serve"}},
	// The request frame the relay writes to the agent is forwarding.
	{stage: "route/forward", patterns: []string{"relay.(*Server).", "relay.(*agentConn).", "relay.(*tunnel).", "relay.(*wsConn).",
		"relay.(*batchConn).", "relay.appendRequestHead", "relay.HeaderFrom", "gorilla/websocket.", "relay.soloNode"}},
}

// classify names the stage of one sample's stack (leaf first). A stack
// none of whose frames a rule matches is "runtime" when it runs only the
// Go runtime or the kernel (GC, the scheduler, sysmon, switching threads),
// and "other" otherwise.
func classify(rules []stageRule, frames []frame) string {
	user := false // a frame in user space was seen
	for _, f := range frames {
		cLeaf := !user && f.cCode()
		user = user || !f.kernel() && !f.unknown()
		for _, r := range rules {
			if cLeaf && r.cLeaf {
				return r.stage
			}
			for _, p := range r.patterns {
				if q, ok := strings.CutPrefix(p, "^"); ok {
					if strings.HasPrefix(f.sym, q) {
						return r.stage
					}
				} else if strings.Contains(f.sym, p) {
					return r.stage
				}
			}
		}
	}
	if innermostOther(frames) == "" {
		return "runtime"
	}
	return "other"
}

// innermostOther is what an "other" sample was doing: the innermost frame
// of Go code outside the runtime, or the leaf's C code ("" if none).
func innermostOther(frames []frame) string {
	user := false
	for _, f := range frames {
		if !user && f.cCode() && !strings.HasPrefix(f.sym, "x_cgo_") && !strings.HasPrefix(f.sym, "_cgo_") || f.goCode() {
			return f.sym
		}
		user = user || !f.kernel() && !f.unknown()
	}
	return ""
}

// A Process is one of calltap's processes as its profile reads it.
type Process struct {
	Name   string   // "relay", "agent": the key of its pid and of its Profile
	Stages []string // every stage a sample can go to, in a request's order, then "runtime" and "other"
	rules  []stageRule
}

// Agent is the agent's process.
func Agent() Process {
	return Process{Name: "agent", Stages: []string{"read frame", "save", "forward", "answer", "console line", "runtime", "other"}, rules: agentStages}
}

// Relay is the relay's process.
func Relay() Process {
	return Process{Name: "relay", Stages: []string{"parse", "route/forward", "read frame", "answer", "runtime", "other"}, rules: relayStages}
}

// A Profile is one process's samples under a load.
type Profile struct {
	Stages map[string]int // stage → samples
	Other  map[string]int // innermost function of the samples of no stage → samples
}

// Samples is the count of the profile's samples.
func (p Profile) Samples() int {
	total := 0
	for _, n := range p.Stages {
		total += n
	}
	return total
}

// TopOther lists the n functions with the most samples of no stage.
func (p Profile) TopOther(n int) string {
	keys := make([]string, 0, len(p.Other))
	for k := range p.Other {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return p.Other[b] - p.Other[a] })
	var parts []string
	for _, k := range keys[:min(n, len(keys))] {
		parts = append(parts, fmt.Sprintf("%s (%d)", k, p.Other[k]))
	}
	return strings.Join(parts, ", ")
}

// Profiles samples the call stacks of each process of procs (perf record
// -F 999 -g, pid by name) under the load spec, into the file that file
// names for it, and counts each one's samples by stage. The files are
// left for the caller to keep or remove.
func Profiles(ctx context.Context, spec load.Spec, procs []Process, pids map[string]int, file func(name string) string) (map[string]Profile, error) {
	names := make([]string, 0, len(procs))
	for _, p := range procs {
		names = append(names, p.Name)
	}
	_, err := under(ctx, spec, names, func(name string) []string {
		return []string{"record", "-q", "-F", "999", "-g", "-p", strconv.Itoa(pids[name]), "-o", file(name)}
	})
	if err != nil {
		return nil, err
	}
	profiles := map[string]Profile{}
	for _, p := range procs {
		stages, other, err := countStages(ctx, file(p.Name), p.rules)
		if err != nil {
			return nil, fmt.Errorf("perf script of the %s: %w", p.Name, err)
		}
		profiles[p.Name] = Profile{Stages: stages, Other: other}
	}
	return profiles, nil
}

// countStages reads `perf script` of a recording and counts its samples by
// stage; other counts the unclassified ones by their innermost function.
func countStages(ctx context.Context, file string, rules []stageRule) (stages, other map[string]int, err error) {
	cmd := command(ctx, "script", "-i", file, "-F", "ip,sym,dso", "--no-inline")
	outp, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	stages, other = map[string]int{}, map[string]int{}
	var frames []frame
	flush := func() {
		if len(frames) == 0 {
			return
		}
		s := classify(rules, frames)
		stages[s]++
		if s == "other" {
			other[innermostOther(frames)]++
		}
		frames = frames[:0]
	}
	sc := bufio.NewScanner(outp)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			flush()
			continue
		}
		// "ffffffff8a2c3f1e __schedule ([kernel.kallsyms])",
		// "5dab74 sqlite3VdbeExec (/path/bin/calltap)", "0 [unknown] ([unknown])"
		_, rest, _ := strings.Cut(line, " ")
		var f frame
		if i := strings.LastIndex(rest, " ("); i >= 0 && strings.HasSuffix(rest, ")") {
			f.sym, f.dso = rest[:i], rest[i+2:len(rest)-1]
		} else {
			f.sym = rest
		}
		if i := strings.LastIndex(f.sym, "+0x"); i > 0 {
			f.sym = f.sym[:i]
		}
		f.sym = strings.TrimSpace(f.sym)
		frames = append(frames, f)
	}
	flush()
	io.Copy(io.Discard, outp)
	if err := cmd.Wait(); err != nil {
		return nil, nil, cmdErr(cmd, err)
	}
	if err := sc.Err(); err != nil {
		return nil, nil, err
	}
	if len(stages) == 0 {
		return nil, nil, errors.New("no samples")
	}
	return stages, other, nil
}
