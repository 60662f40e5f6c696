package frameconn

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/relay/wire"
	"github.com/gorilla/websocket"
)

// countingConn counts the writes that reach a real socket.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// tcpPair is a connected pair of loopback TCP sockets.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func TestBatchConnWritesABatchAtOnce(t *testing.T) {
	client, server := tcpPair(t)
	cc := &countingConn{Conn: client}
	bc := newBatchConn(cc)

	var want bytes.Buffer
	write := func(p []byte) {
		t.Helper()
		if n, err := bc.Write(p); err != nil || n != len(p) {
			t.Fatalf("Write: %d, %v", n, err)
		}
		want.Write(p)
	}
	// Outside a batch every write goes straight out.
	write([]byte("hello "))
	if n := cc.writes.Load(); n != 1 {
		t.Fatalf("a write outside a batch made %d socket writes", n)
	}
	// A batch of small frames leaves in one write, at release.
	bc.begin()
	for range 100 {
		write([]byte("frame;"))
	}
	if n := cc.writes.Load(); n != 1 {
		t.Fatalf("writes inside a batch reached the socket before release: %d", n)
	}
	if err := bc.release(); err != nil {
		t.Fatal(err)
	}
	if n := cc.writes.Load(); n != 2 {
		t.Fatalf("a batch of 100 frames took %d socket writes, want 1", n-1)
	}
	// A large body does not go through the buffer: what was collected goes
	// first, then the body as it is.
	bc.begin()
	write([]byte("head;"))
	big := bytes.Repeat([]byte{'x'}, 3*batchFlushAt)
	write(big)
	write([]byte(";tail"))
	if err := bc.release(); err != nil {
		t.Fatal(err)
	}
	if n := cc.writes.Load(); n != 5 {
		t.Errorf("head, large body, tail: %d socket writes, want 3", n-2)
	}
	if bc.buf != nil {
		t.Error("an idle connection still holds a batch buffer")
	}
	client.Close()
	got, err := io.ReadAll(server)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Errorf("the bytes arrived changed or out of order (%d bytes, want %d)", len(got), want.Len())
	}
}

// wsPair is a websocket over loopback TCP with a Conn at each end, made
// as the relay (Accept) and the agent (Dial) make them.
func wsPair(t *testing.T) (sender, receiver *Conn) {
	t.Helper()
	return wsPairProbing(t, Keepalive{}, nil)
}

// wsPairProbing is wsPair with the relay's end (receiver) timed by keep
// and watched by onProbe (if not nil).
func wsPairProbing(t *testing.T, keep Keepalive, onProbe func(*Conn)) (sender, receiver *Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Conn, 1)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := Accept(&websocket.Upgrader{}, w, r, 1<<20, keep)
		if err != nil {
			return
		}
		if onProbe != nil {
			c.OnProbe(func() { onProbe(c) })
		}
		got <- c
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	sender, _, err = Dial(context.Background(), websocket.Dialer{}, "ws://"+ln.Addr().String()+"/", nil, 1<<20, Keepalive{})
	if err != nil {
		t.Fatal(err)
	}
	receiver = <-got
	go sender.SendLoop()
	go receiver.SendLoop()
	t.Cleanup(func() { sender.Close(nil); receiver.Close(nil) })
	return sender, receiver
}

// Senders writing their own frames and senders queueing behind a busy
// writer mix, yet each sender's frames arrive in the order it sent them,
// and every written callback runs once.
func TestConnKeepsEachSendersOrder(t *testing.T) {
	sender, receiver := wsPair(t)
	const senders, each = 8, 300
	var callbacks atomic.Int64
	allWritten := make(chan struct{})
	var wg sync.WaitGroup
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				f := Frame{Head: wire.AppendAck([]byte{byte(s)}, wire.Ack{Stream: uint64(i)}), Written: func() {
					if callbacks.Add(1) == senders*each {
						close(allWritten)
					}
				}}
				if i%10 == 0 {
					// Several frames at once, as the agent's acks of a commit go.
					if err := sender.SendAll([]Frame{f}, nil); err != nil {
						t.Error(err)
						return
					}
					continue
				}
				if err := sender.Send(f, nil); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	next := make([]uint64, senders)
	for n := 0; n < senders*each; n++ {
		buf, err := receiver.ReadFrame()
		if err != nil {
			t.Fatalf("after %d frames: %v", n, err)
		}
		b := buf.Bytes()
		s := int(b[0])
		a, err := wire.DecodeAck(b[1:])
		PutBuf(buf)
		if err != nil {
			t.Fatal(err)
		}
		i := a.Stream
		if i != next[s] {
			t.Fatalf("sender %d: frame %d arrived when %d was next", s, i, next[s])
		}
		next[s]++
	}
	wg.Wait()
	// sendLoop runs a batch's callbacks after the batch has left, so the
	// last ones may still be running when the frames have all arrived.
	select {
	case <-allWritten:
	case <-time.After(time.Minute):
	}
	if n := callbacks.Load(); n != senders*each {
		t.Errorf("%d written callbacks for %d frames", n, senders*each)
	}
}

// An agent stopping (Finish, as the tunnel's stop ends) while its last
// answers wait behind a busy writer writes its close after them: the relay
// reads every answer, then the close. (Written ahead, the close made the
// relay tell those senders the agent left without answering.)
func TestFinishWritesQueuedAnswersBeforeClose(t *testing.T) {
	sender, receiver := wsPair(t)
	const answers = 50
	sender.writeMu.Lock() // a writer busy with a large frame
	for i := range answers {
		if err := sender.Send(Frame{Head: wire.AppendAck(nil, wire.Ack{Stream: uint64(i)})}, nil); err != nil {
			sender.writeMu.Unlock()
			t.Fatal(err)
		}
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		sender.Finish(websocket.CloseGoingAway, "agent stopping", context.Canceled)
	}()
	// The stop is under way; the busy writer finishes only now.
	select {
	case <-stopped:
		t.Error("the stop closed the connection with answers still queued")
	case <-time.After(50 * time.Millisecond): // lets a wrong stop go ahead; never a readiness wait
	}
	sender.writeMu.Unlock()
	for i := range answers {
		buf, err := receiver.ReadFrame()
		if err != nil {
			t.Fatalf("answer %d of %d: %v", i, answers, err)
		}
		got, err := wire.DecodeAck(buf.Bytes())
		PutBuf(buf)
		if err != nil || got.Stream != uint64(i) {
			t.Fatalf("frame %d: %d, %v", i, got, err)
		}
	}
	if _, err := receiver.ReadFrame(); !websocket.IsCloseError(err, websocket.CloseGoingAway) {
		t.Errorf("after the answers: %v, want the agent's close", err)
	}
	<-stopped
}

// The relay's end probes its peer: while the peer reads (and so answers
// pings), Silence comes back to zero; once it stops reading, Silence
// grows for as long as it stays silent, and falls to zero again when it
// reads once more. OnProbe runs at each ping's tick.
func TestSilenceOfAPeerThatStopsReading(t *testing.T) {
	var probes atomic.Int64
	peer, relayEnd := wsPairProbing(t, Keepalive{ProbeEvery: 10 * time.Millisecond}, func(*Conn) { probes.Add(1) })
	go func() { // pongs are read by the reader, as the relay's read loop does
		for {
			buf, err := relayEnd.ReadFrame()
			if err != nil {
				return
			}
			PutBuf(buf)
		}
	}()
	pause, resume := make(chan struct{}), make(chan struct{})
	go func() {
		for {
			buf, err := peer.ReadFrame()
			if err != nil {
				return
			}
			PutBuf(buf)
			select {
			case <-pause: // a frame while paused: stop reading until resumed
				<-resume
			default:
			}
		}
	}()
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		polltest.Until(t, 10*time.Second, ok, what)
	}
	waitFor("a reading peer answers", func() bool { return probes.Load() >= 3 && relayEnd.Silence() == 0 })

	close(pause)
	if err := relayEnd.Send(Frame{Head: wire.AppendAck(nil, wire.Ack{Stream: 1})}, nil); err != nil {
		t.Fatal(err)
	}
	waitFor("a peer that stopped reading is silent", func() bool { return relayEnd.Silence() >= 300*time.Millisecond })
	first := relayEnd.Silence()
	waitFor("its silence grows", func() bool { return relayEnd.Silence() > first })

	close(resume)
	waitFor("a peer reading again answers", func() bool { return relayEnd.Silence() == 0 })
}

// A probing end pings at its probe's interval, unless its pong wait asks
// for pings sooner; one that does not probe (the agent's) pings at 9/10 of
// its pong wait, as before.
func TestPingEveryIsTheShorterOfProbeAndPongWait(t *testing.T) {
	for _, c := range []struct {
		keep Keepalive
		want time.Duration
	}{
		{Keepalive{PongWait: 30 * time.Second}, 27 * time.Second},
		{Keepalive{PongWait: 30 * time.Second, ProbeEvery: time.Second}, time.Second},
		{Keepalive{PongWait: 300 * time.Millisecond, ProbeEvery: time.Second}, 270 * time.Millisecond},
		{Keepalive{PongWait: 30 * time.Second, ProbeEvery: -1}, 27 * time.Second},
	} {
		if got := c.keep.pingEvery(); got != c.want {
			t.Errorf("%+v: pings every %v, want %v", c.keep, got, c.want)
		}
	}
}
