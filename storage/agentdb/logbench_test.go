package agentdb_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/calltap/calltap/storage/agentdb"
)

// BenchmarkLogCaptures is the agent's answer path: a batch of captures
// appended to the intake log (and synced), then their responses. ns/op is
// per capture.
func BenchmarkLogCaptures(b *testing.B) {
	ctx := context.Background()
	for _, batch := range []int{1, 32} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			db := openBenchDB(b, b.TempDir(), agentdb.WithIntake())
			pool := make([]*agentdb.Capture, 1024)
			for i := range pool {
				pool[i] = benchCapture(i)
			}
			b.SetBytes(int64(len(pool[0].Body)))
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; {
				n := min(batch, b.N-done)
				ins := make([]*agentdb.Capture, n)
				upd := make([]*agentdb.Capture, n)
				for j := range ins {
					c := *pool[(done+j)%len(pool)]
					c.ID = fmt.Sprintf("%s-%d", c.ID[:24], done+j)
					c.DeliveryID = c.ID
					ins[j], upd[j] = &c, responded(&c)
				}
				if _, err := db.LogCaptures(ctx, ins, nil); err != nil {
					b.Fatal(err)
				}
				if _, err := db.LogCaptures(ctx, nil, upd); err != nil {
					b.Fatal(err)
				}
				done += n
			}
		})
	}
}
