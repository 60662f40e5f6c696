package main

import (
	"bytes"
	"testing"

	"github.com/calltap/calltap/scripts/benchrun/load"
)

// The suite must never make the agent reach beyond loopback: the agent
// downloads the media links of the events it captures.
func TestBodiesCarryNoLinks(t *testing.T) {
	b, stamp := jsonEvent2K()
	if len(b) != 2048 {
		t.Fatalf("event is %d bytes, want 2048", len(b))
	}
	if bytes.Contains(b, []byte("://")) {
		t.Fatalf("event carries a link: %s", b)
	}
	load.StampHex(b, stamp, 0xabcdef)
	if !bytes.Contains(b, []byte("000000abcdef")) {
		t.Fatalf("stamp offset %d does not hit the delivery id: %s", stamp, b[:80])
	}
}
