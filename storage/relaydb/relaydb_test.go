package relaydb

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/polltest"
)

// Callers that arrive while a commit runs share the next one, in the order
// they came; each gets its own commit's result.
func TestGroupCommitSharesCommits(t *testing.T) {
	var g groupCommit[int]
	entered, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var commits [][]int
	commit := func(vs []int) error {
		if vs[0] == 0 {
			close(entered)
			<-release // the first commit runs while the others arrive
		}
		mu.Lock()
		commits = append(commits, vs)
		mu.Unlock()
		if vs[0] == 1 {
			return errors.New("disk full")
		}
		return nil
	}
	errs := make([]error, 6)
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = g.do(0, commit) })
	waitPending := func(n int) {
		t.Helper()
		polltest.Until(t, 5*time.Second, func() bool {
			g.mu.Lock()
			defer g.mu.Unlock()
			return len(g.pending) == n
		}, fmt.Sprintf("%d callers never waited together", n))
	}
	<-entered // the first leads, with nothing else waiting
	for i := 1; i < 6; i++ {
		wg.Go(func() { errs[i] = g.do(i, commit) })
		waitPending(i)
	}
	close(release)
	wg.Wait()
	if fmt.Sprint(commits) != "[[0] [1 2 3 4 5]]" {
		t.Errorf("commits %v, want [[0] [1 2 3 4 5]]", commits)
	}
	if errs[0] != nil {
		t.Errorf("the first caller got %v", errs[0])
	}
	for i := 1; i < 6; i++ {
		if errs[i] == nil || errs[i].Error() != "disk full" {
			t.Errorf("caller %d got %v, want its commit's error", i, errs[i])
		}
	}
}

// Concurrent enqueues are all kept, each with its own place, in the order
// of their places.
func TestConcurrentEnqueues(t *testing.T) {
	ctx := context.Background()
	db, err := Open(ctx, filepath.Join(t.TempDir(), "relay.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const n = 200
	reqs := make([]*QueuedRequest, n)
	var wg sync.WaitGroup
	for i := range n {
		reqs[i] = &QueuedRequest{ID: fmt.Sprintf("q-%d", i), TunnelID: "t1", ArrivedAt: int64(i), Method: "POST", URI: "/", Headers: []byte{}, Body: []byte(fmt.Sprint(i))}
		wg.Go(func() {
			if err := db.Enqueue(ctx, reqs[i]); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	got, err := db.QueuedAfter(ctx, "t1", 0, 2*n)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("%d queued, want %d", len(got), n)
	}
	seqOf := map[string]int64{}
	for _, r := range reqs {
		if r.Seq == 0 {
			t.Fatalf("%s was given no place", r.ID)
		}
		seqOf[r.ID] = r.Seq
	}
	for _, q := range got {
		if seqOf[q.ID] != q.Seq {
			t.Errorf("%s: stored at %d, told %d", q.ID, q.Seq, seqOf[q.ID])
		}
	}
}
