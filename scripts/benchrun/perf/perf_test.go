package perf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadPerfStat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stat.txt")
	out := `# started on Thu Nov 26 13:36:41 2026


 Performance counter stats for process id '4242':

            91,234      raw_syscalls:sys_enter
     <not counted>      context-switches

       2.400468848 seconds time elapsed

`
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	counts, elapsed, err := readStat(path)
	if err != nil {
		t.Fatal(err)
	}
	if counts["raw_syscalls:sys_enter"] != 91234 || counts["context-switches"] != 0 || elapsed.Seconds() < 2.4 || elapsed.Seconds() > 2.41 {
		t.Errorf("got %v, %v", counts, elapsed)
	}
}

// stack is a sample as perf script prints it with -F ip,sym,dso, leaf first.
func stack(lines ...string) []frame {
	var fs []frame
	for _, l := range lines {
		sym, dso, _ := strings.Cut(l, " @")
		if dso == "" {
			dso = "/x/bin/calltap-prof"
		}
		fs = append(fs, frame{sym: sym, dso: dso})
	}
	return fs
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rules []stageRule
		stack []frame
		want  string
	}{
		{"agent: SQLite, its chain lost", agentStages, stack("pvm_irq_enable @[kernel.kallsyms]", "pagerWalFrames", "[unknown] @[unknown]"), "save"},
		{"agent: libc under SQLite", agentStages, stack("__libc_pwrite @/usr/lib/x86_64-linux-gnu/libc.so.6", "[unknown] @[unknown]"), "save"},
		{"agent: a gcc clone", agentStages, stack("keywordCode.constprop.0"), "save"},
		{"agent: the websocket read under batchConn", agentStages, stack("net.(*netFD).Read",
			"github.com/calltap/calltap/relay.(*batchConn).Read", "bufio.(*Reader).fill", "github.com/gorilla/websocket.(*Conn).NextReader",
			"github.com/calltap/calltap/relay.(*wsConn).readFrame", "github.com/calltap/calltap/relay.(*clientConn).readLoop"), "read frame"},
		{"agent: the handler's answer", agentStages, stack("net/http.ReadResponse",
			"github.com/calltap/calltap/inspector/agent.(*handlerClient).exchange", "github.com/calltap/calltap/inspector/agent.(*Agent).sendOnce"), "forward"},
		{"agent: the answer frame", agentStages, stack("net.(*netFD).Write", "github.com/calltap/calltap/relay.(*batchConn).Write",
			"github.com/calltap/calltap/relay.(*wsConn).sendLoop"), "answer"},
		{"agent: sysmon", agentStages, stack("finish_task_switch.isra.0 @[kernel.kallsyms]", "runtime.usleep.abi0", "runtime.sysmon",
			"runtime.mstart.abi0", "start_thread @/usr/lib/x86_64-linux-gnu/libc.so.6"), "runtime"},
		{"agent: the clock", agentStages, stack("__vdso_clock_gettime @[vdso]", "runtime.nanotime1.abi0", "runtime.findRunnable"), "runtime"},
		{"relay: the request head", relayStages, stack("net/textproto.readMIMEHeader", "net/http.readRequest",
			"net/http.(*conn).readRequest", "net/http.(*conn).serve"), "parse"},
		{"relay: the answer", relayStages, stack("net.(*netFD).Write", "bufio.(*Writer).Flush", "net/http.(*response).finishRequest",
			"net/http.(*conn).serve"), "answer"},
		{"relay: the request frame", relayStages, stack("github.com/calltap/calltap/relay.appendRequestHead",
			"github.com/calltap/calltap/relay.(*agentConn).roundTrip", "github.com/calltap/calltap/relay.(*Server).forward",
			"net/http.serverHandler.ServeHTTP", "net/http.(*conn).serve"), "route/forward"},
		{"relay: nothing known", relayStages, stack("encoding/json.Marshal", "main.main"), "other"},
	} {
		if got := classify(tc.rules, tc.stack); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}
