//go:build !unix

package agent

// alive reports whether an idle connection can carry a request. Without a
// non-blocking peek here, only bytes already buffered say no; a connection
// the handler closed is caught by do's single retry.
func (c *handlerConn) alive() bool { return c.br.Buffered() == 0 }
