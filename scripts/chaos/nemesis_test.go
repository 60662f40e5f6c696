package main

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"reflect"
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
	// Single mode aims only at what it has.
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
// only that: the records before it and the prefilled zeros after stay.
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
	file, off, size, err := tearLastRecord(dir)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(file) != "intake-0000000000000002.log" || off != int64(len(first)) || size != int64(len(last)) {
		t.Fatalf("tore %s at %d (%d bytes), want the last record of generation 2 at %d (%d bytes)", file, off, size, len(first), len(last))
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
