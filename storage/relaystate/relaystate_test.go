package relaystate

import (
	"encoding/hex"
	"testing"
)

// Tokens are kept as their SHA-256, the same in the SQLite store and in
// NATS: a token made on one must authenticate against the hash the other
// kept.
func TestHashToken(t *testing.T) {
	const abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" // FIPS 180-2, "abc"
	if got := hex.EncodeToString(HashToken("abc")); got != abc {
		t.Errorf("HashToken(abc) = %s, want %s", got, abc)
	}
}
