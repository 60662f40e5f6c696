package agentdb

import (
	"context"
	"testing"
)

// The writer prepares its statements once per connection: a second batch
// on the same connection finds them ready.
func TestWriterKeepsItsStatements(t *testing.T) {
	ctx := context.Background()
	db := openAgentDB(t)
	var first, second *rawConn
	for i, w := range []**rawConn{&first, &second} {
		if err := db.writeRaw(ctx, func(rc *rawConn) error {
			*w = rc
			_, err := rc.insertCapture(testCapture(i, []byte(`{}`)))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	if first != second || len(second.stmts) == 0 {
		t.Fatalf("the second batch ran on writer state %p (%d statements), the first on %p", second, len(second.stmts), first)
	}
}
