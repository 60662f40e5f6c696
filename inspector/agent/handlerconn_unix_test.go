//go:build unix

package agent

import (
	"bufio"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

func TestHandlerConnAlive(t *testing.T) {
	// An idle connection is reusable while the handler keeps it open and
	// has sent nothing; once it closes its end (or sends stray bytes) the
	// pool must see that before writing a request into it.
	peers := make(chan net.Conn, 1)
	addr, _ := rawHandler(t, func(_ *bufio.Reader, c net.Conn) {
		peers <- c
		<-t.Context().Done() // the test closes c, or ends
	})
	dial := func() (*handlerConn, net.Conn) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return &handlerConn{Conn: c, br: bufio.NewReader(c)}, <-peers
	}

	open, _ := dial()
	if !open.alive() {
		t.Fatal("an open idle connection is reported dead")
	}
	closed, peer := dial()
	peer.Close()
	waitReadable(t, closed)
	if closed.alive() {
		t.Error("a connection the handler closed is reported alive")
	}

	chatty, peer := dial()
	io.WriteString(peer, "HTTP/1.1 200 OK\r\n")
	waitReadable(t, chatty)
	if chatty.alive() {
		t.Error("a connection with bytes nobody asked for is reported alive")
	}
	// Peeking took nothing: the stray bytes are still there to read.
	line, err := chatty.br.ReadString('\n')
	if err != nil || line != "HTTP/1.1 200 OK\r\n" {
		t.Fatalf("after alive(): read %q, %v", line, err)
	}
	if !open.alive() {
		t.Fatal("the open connection is reported dead after a while")
	}
}

// waitReadable waits, through Go's poller, until the handler's bytes or
// its end of stream reach c's socket, consuming nothing.
func waitReadable(t *testing.T, c *handlerConn) {
	t.Helper()
	raw, err := c.Conn.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(time.Minute))
	defer c.SetReadDeadline(time.Time{})
	var buf [1]byte
	err = raw.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return err != syscall.EAGAIN && err != syscall.EWOULDBLOCK // false: wait for readiness
	})
	if err != nil {
		t.Fatalf("nothing reached the socket: %v", err)
	}
}
