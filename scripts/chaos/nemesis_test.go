package main

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/calltap/calltap/scripts/chaos/history"
)

// A seed replays the same schedule exactly; another seed draws another;
// a long team run draws every kind of fault, and two NATS servers at once.
func TestPlanIsSeeded(t *testing.T) {
	team := shape{relays: 3, nats: 3, diskLimited: true}
	a, b := plan(42, 30*time.Minute, team), plan(42, 30*time.Minute, team)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two plans of seed 42 differ")
	}
	if reflect.DeepEqual(a, plan(43, 30*time.Minute, team)) {
		t.Fatal("seeds 42 and 43 drew the same plan")
	}
	kinds := map[string]bool{}
	pair := false
	for _, f := range a {
		kinds[f.Kind] = true
		pair = pair || len(f.Targets) == 2
		if f.At < 0 || f.At+f.Hold > 30*time.Minute {
			t.Errorf("fault %+v outside the run", f)
		}
	}
	for _, k := range []string{history.FaultSigkill, history.FaultSigterm, history.FaultSigstop, history.FaultNetCut,
		history.FaultNetSlow, history.FaultNetDrop, history.FaultDiskFull, history.FaultPowerCut} {
		if !kinds[k] {
			t.Errorf("a 30-minute plan has no %s", k)
		}
	}
	if !pair {
		t.Error("a 30-minute plan never stops two NATS servers at once")
	}
}

// Single mode aims only at what it has: one relay, the agent, their link,
// and no disk-full on a disk without a size limit.
func TestPlanSingleMode(t *testing.T) {
	for _, f := range plan(7, 30*time.Minute, shape{relays: 1}) {
		for _, tg := range f.Targets {
			if tg != "agent" && tg != "relay-0" && tg != "agent->relay-0" && tg != "agent->relay" {
				t.Errorf("single-mode fault %s aims at %s", f.Kind, tg)
			}
		}
		if f.Kind == history.FaultDiskFull {
			t.Errorf("disk-full planned on a disk without a size limit")
		}
	}
}

// A power cut zeroes the second half of the newest log's last record, and
// only that: the records before it and the prefilled zeros after stay. A
// last record the disk had synced stays whole.
func TestTearLastRecord(t *testing.T) {
	dir := t.TempDir()
	bodies := filepath.Join(dir, "agent-bodies")
	if err := os.MkdirAll(bodies, 0o755); err != nil {
		t.Fatal(err)
	}
	frame := func(payload string) []byte {
		b := binary.LittleEndian.AppendUint32(nil, uint32(len(payload)))
		b = binary.LittleEndian.AppendUint32(b, 0xdeadbeef) // the tear does not read the checksum
		return append(b, payload...)
	}
	older := append(frame("old record"), make([]byte, 64)...)
	first, last := frame("first record"), frame("the last record, torn by the power cut")
	newest := append(append(append([]byte{}, first...), last...), make([]byte, 128)...)
	empty := make([]byte, 256) // the next generation, prefilled and still empty
	for name, b := range map[string][]byte{"intake-0000000000000001.log": older, "intake-0000000000000002.log": newest, "intake-0000000000000003.log": empty} {
		if err := os.WriteFile(filepath.Join(bodies, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A record the disk had synced is left whole.
	kept, err := tearLastRecord(dir, func(p []byte) bool { return bytes.Equal(p, last[8:]) })
	if err != nil || !kept.kept {
		t.Fatalf("a synced last record: %+v, %v; want it kept", kept, err)
	}
	if b, _ := os.ReadFile(filepath.Join(bodies, "intake-0000000000000002.log")); !bytes.Equal(b, newest) {
		t.Fatal("a synced record was torn")
	}
	tr, err := tearLastRecord(dir, func([]byte) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	file, off, size := tr.file, tr.off, tr.size
	if filepath.Base(file) != "intake-0000000000000002.log" || off != int64(len(first)) || size != int64(len(last)) || tr.kept || tr.kind != 't' {
		t.Fatalf("tore %+v, want the last record of generation 2 at %d (%d bytes)", tr, len(first), len(last))
	}
	got, _ := os.ReadFile(file)
	want := append([]byte{}, newest...)
	copy(want[off+size/2:off+size], make([]byte, size-size/2))
	if !bytes.Equal(got, want) {
		t.Errorf("after the tear:\n%q\nwant\n%q", got, want)
	}
	if b, _ := os.ReadFile(filepath.Join(bodies, "intake-0000000000000001.log")); !bytes.Equal(b, older) {
		t.Error("an older log changed")
	}
}

// Under --sync full an insert naming a delivery some sender was answered
// 2xx for had been synced, so a power cut cannot tear it; an update (the
// handler's answer, not synced on its own) or an unacknowledged insert can
// be torn.
func TestSyncedRecord(t *testing.T) {
	const acked = "0b7e6a52-5d1f-4c3e-9a8b-1c2d3e4f5a6b"
	n := &nemesis{acked: func(id string) bool { return id == acked }}
	for _, tc := range []struct {
		payload string
		want    bool
	}{
		{"\x01\x24" + acked + "rest", true},
		{"\x02\x10{\"delivery_id\":\"" + acked + "\"}", false},
		{"\x01\x24" + "9f9f9f9f-5d1f-4c3e-9a8b-1c2d3e4f5a6b", false},
		{"", false},
	} {
		if got := n.synced([]byte(tc.payload)); got != tc.want {
			t.Errorf("synced(%q) = %v, want %v", tc.payload, got, tc.want)
		}
	}
}

// With claimant agents (team mode), kills, stops and link faults aim at
// each claimant's agent too (a claimant away keeps its calls), and the
// faults of the default agent's disk at it alone.
func TestPlanAimsAtClaimants(t *testing.T) {
	sh := shape{relays: 3, nats: 3, diskLimited: true, agents: []string{"agent", "agent-alice", "agent-bob", "agent-carol"}}
	hit := map[string]bool{} // kind/target
	for _, f := range plan(42, 30*time.Minute, sh) {
		for _, tg := range f.Targets {
			hit[f.Kind+"/"+tg] = true
			if (f.Kind == history.FaultDiskFull || f.Kind == history.FaultPowerCut) && tg != "agent" {
				t.Errorf("%s aims at %s, not the default agent whose disk it is", f.Kind, tg)
			}
		}
	}
	kinds := map[string]bool{}
	for _, a := range sh.agents[1:] {
		if !hit[history.FaultSigkill+"/"+a] && !hit[history.FaultSigstop+"/"+a] {
			t.Errorf("a 30-minute team plan neither kills nor freezes %s", a)
		}
		for _, k := range []string{history.FaultSigkill, history.FaultSigstop} {
			kinds[k] = kinds[k] || hit[k+"/"+a]
		}
	}
	if !kinds[history.FaultSigkill] || !kinds[history.FaultSigstop] {
		t.Errorf("a 30-minute team plan kills a claimant's agent: %v, freezes one: %v; want both", kinds[history.FaultSigkill], kinds[history.FaultSigstop])
	}
	links := 0
	for k := range hit {
		if strings.Contains(k, "/agent-") && strings.Contains(k, "->relay") {
			links++
		}
	}
	if links == 0 {
		t.Error("a 30-minute team plan never breaks a claimant's link")
	}
}
