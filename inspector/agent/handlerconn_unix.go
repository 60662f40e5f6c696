//go:build unix

package agent

import "syscall"

// alive reports whether an idle connection can carry a request: the
// handler may have closed it (Node closes idle ones after 5 s), and an
// early answer or stray bytes make it unusable too. A read with an expired
// deadline would not tell (Go fails it before reaching the socket), so
// this peeks at the socket without waiting and without taking anything.
func (c *handlerConn) alive() bool {
	if c.br.Buffered() > 0 {
		return false
	}
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return true // not a socket: a stale one is caught by do's retry
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var buf [1]byte
	var peekErr error
	err = raw.Read(func(fd uintptr) bool {
		_, _, peekErr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true // never wait for readiness
	})
	// EAGAIN: open and nothing to read. nil: bytes, or 0 of them at EOF.
	return err == nil && (peekErr == syscall.EAGAIN || peekErr == syscall.EWOULDBLOCK)
}
