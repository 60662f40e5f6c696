package agent

import (
	"bytes"
	"log/slog"
	"testing"
	"time"

	"github.com/calltap/calltap/storage/agentdb"
)

// Answers the reserve has no room for are counted lost, apart from those
// it kept: two answers of 600 KiB in a 1 MiB reserve, one kept, one lost.
func TestSpillAnswersCountsTheLost(t *testing.T) {
	d := openDisk(t)
	log := &logged{}
	a, err := New(Config{Store: d.store, Logger: slog.New(log)})
	if err != nil {
		t.Fatal(err)
	}
	a.cm.answers.timer.Stop()
	if err := d.store.ReserveAnswers(); err != nil {
		t.Fatal(err)
	}
	var caps []*agentdb.Capture
	for range 2 {
		c := testCapture(`{}`)
		c.Status, c.Attempts, c.ResponseStatus, c.Duration = agentdb.StatusDelivered, 1, 200, time.Millisecond
		c.ResponseBody = bytes.Repeat([]byte("a"), 600<<10)
		caps = append(caps, c)
	}
	a.spillAnswers(caps)
	expectLogged(t, "spilled two, room for one", log.take(),
		loggedRecord{level: slog.LevelWarn, msg: "answers not recorded for want of room", count: 1},
		loggedRecord{level: slog.LevelError, msg: "answers lost", count: 1})
}
