// The two ways a Conn begins: the relay accepts an agent's upgrade, the
// agent dials the relay. Either way the socket under the websocket is a
// batchConn.

package frameconn

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"

	"github.com/gorilla/websocket"
)

// Accept upgrades an agent's request to a websocket over a batchConn
// (up answers the request itself when it cannot) and returns it as a Conn
// reading frames up to maxFrame. It probes the agent every
// keep.ProbeEvery, DefaultProbeEvery when that is zero.
func Accept(up *websocket.Upgrader, w http.ResponseWriter, r *http.Request, maxFrame int64, keep Keepalive) (*Conn, error) {
	if keep.ProbeEvery == 0 {
		keep.ProbeEvery = DefaultProbeEvery
	}
	hw := &hijackBatch{ResponseWriter: w}
	ws, err := up.Upgrade(hw, r, nil)
	if err != nil {
		return nil, err
	}
	return newConn(ws, hw.bc, maxFrame, keep), nil
}

// Dial opens a websocket to url with d, over a batchConn around the
// connection d's NetDialContext (or a plain net.Dialer) makes, and returns
// it as a Conn reading frames up to maxFrame. The response is the
// handshake's, for the caller to read why it failed.
func Dial(ctx context.Context, d websocket.Dialer, url string, h http.Header, maxFrame int64, keep Keepalive) (*Conn, *http.Response, error) {
	var bc *batchConn
	dial := d.NetDialContext
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	d.NetDialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		bc = newBatchConn(conn)
		return bc, nil
	}
	ws, resp, err := d.DialContext(ctx, url, h)
	if err != nil {
		return nil, resp, err
	}
	return newConn(ws, bc, maxFrame, keep), resp, nil
}

// hijackBatch hands the upgrader a batchConn over the hijacked connection,
// so that the writer can batch its writes.
type hijackBatch struct {
	http.ResponseWriter
	bc *batchConn // set by Hijack
}

func (h *hijackBatch) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := h.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("relay: connection cannot be hijacked")
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	h.bc = newBatchConn(conn)
	return h.bc, brw, nil
}
