// Package tunnel is the agent's end of a tunnel: it connects to the relay,
// reconnects with backoff, hands each request the relay sends to its
// Handler and sends back the Handler's acks and answers. The frames are
// relay/wire's, carried by relay/frameconn.
package tunnel

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/calltap/calltap/relay/claim"
	"github.com/calltap/calltap/relay/frameconn"
	"github.com/calltap/calltap/relay/wire"
	"github.com/gorilla/websocket"
)

// Handler receives the requests of a tunnel on the agent's side. ServeTunnel
// is called from the connection's read loop in arrival order; it must hand
// the request off quickly (blocking here is backpressure on the relay) and
// later call s.Ack once the request is saved and s.Respond for a live one.
type Handler interface {
	ServeTunnel(req *wire.Request, s *Stream)
}

// Stream is the agent's handle on one request.
type Stream struct {
	c      *clientConn
	stream uint64
	queued bool // from the offline queue: done once acknowledged
	once   sync.Once
	buf    *bytes.Buffer // backs wire.Request.Body
	ended  sync.Once
}

// Ack tells the relay the request is saved. A queued request is removed
// from the relay's queue only after this; for a live one the response says
// it too, so the agent acks one only when its handler is slow.
func (s *Stream) Ack() {
	s.c.sendUnlessClosed(frameconn.Frame{Head: wire.AppendAck(nil, wire.Ack{Stream: s.stream})})
	if s.queued {
		s.end()
	}
}

// end tells a stopping connection that the relay has all it will get of
// this request.
func (s *Stream) end() { s.ended.Do(s.c.streams.Done) }

// AckAll acknowledges many saved requests at once: the agent's writer
// calls it once per commit, so that a commit's acks leave in one write.
func AckAll(ss []*Stream) {
	sendEach(ss, func(s *Stream) frameconn.Frame {
		return frameconn.Frame{Head: wire.AppendAck(nil, wire.Ack{Stream: s.stream})}
	})
	for _, s := range ss {
		if s.queued {
			s.end()
		}
	}
}

// RespondAll sends the answers of many live requests at once, rs[i] to
// ss[i], as Respond would one by one: the agent's writer calls it once per
// commit for the requests whose handler answered before it, so that their
// answers leave in one write.
func RespondAll(ss []*Stream, rs []*wire.Response) {
	i := 0
	sendEach(ss, func(s *Stream) frameconn.Frame { f := s.responseFrame(rs[i]); i++; return f })
	for _, s := range ss {
		s.end()
	}
}

// sendEach sends frame(s) for each of ss in order, a batch per connection
// (a reconnect may fall in the middle of ss).
func sendEach(ss []*Stream, frame func(*Stream) frameconn.Frame) {
	var (
		cc     *clientConn
		frames []frameconn.Frame
	)
	flush := func() {
		if len(frames) > 0 {
			cc.SendAll(frames, nil)
		}
		frames = frames[:0]
	}
	for _, s := range ss {
		if s.c != cc {
			flush()
			cc = s.c
		}
		frames = append(frames, frame(s))
	}
	flush()
}

// Respond sends the local handler's answer (live requests only). Call it at
// most once. It does not release the request's body: call Release for that.
//
// An answer over the relay's limits (see Limits) goes as ResultTooLarge
// instead, which fails this request alone; the caller should check first
// with Limits().Check, to record why.
func (s *Stream) Respond(r *wire.Response) {
	s.c.sendUnlessClosed(s.responseFrame(r))
	s.end()
}

// responseFrame is the frame that carries r, the answer to s.
func (s *Stream) responseFrame(r *wire.Response) frameconn.Frame {
	r.Stream = s.stream
	if err := s.Limits().Check(r); err != nil {
		s.c.client.log.Warn("the handler's answer exceeds the relay's limits", "err", err)
		r = &wire.Response{Stream: s.stream, Result: wire.ResultTooLarge, Error: err.Error()}
	}
	if r.Result == wire.ResultTooLarge && !s.c.knowsTooLarge.Load() {
		r.Result = wire.ResultUnreachable // what an older relay understands, with the same 502
	}
	return frameconn.Frame{Head: wire.AppendResponseHead(nil, r), Body: r.Body}
}

// Limits are what the relay takes on this request's connection.
func (s *Stream) Limits() wire.Limits {
	if l := s.c.limits.Load(); l != nil {
		return *l
	}
	return wire.Limits{}
}

// ForwardTimeout is how long the relay waits for this request's response
// before answering its sender 504, as its hello said; 0 from a relay that
// does not say, which also does not understand ResultQueued.
func (s *Stream) ForwardTimeout() time.Duration { return s.c.forwardTimeout }

// Release returns the request body's buffer once nothing uses it.
func (s *Stream) Release() {
	s.once.Do(func() { frameconn.PutBuf(s.buf) })
}

// ConnState is what the agent shows about its tunnel.
type ConnState struct {
	State  string      // connected | reconnecting | offline
	Hello  *wire.Hello // set while connected
	Notice wire.Notice
	Err    error // why the last connection ended
}

// Connection states.
const (
	StateConnected    = "connected"
	StateReconnecting = "reconnecting"
	StateOffline      = "offline"
)

// Config configures an agent's connection to a relay.
type Config struct {
	// RelayURL is http(s)://host[:port] of the relay, or of several nodes
	// of one relay, comma-separated: the client moves to the next when a
	// connection fails or ends. (One name that resolves to several
	// addresses works too: the dialer tries each address in turn.)
	RelayURL       string
	Resolver       *net.Resolver // looks the relay's name up; nil: the system's
	Token          string
	RequireHeaders []string // "Name: value" every sender must present
	// Claims are what this agent claims calls by, when it shares its
	// token with others (relay/claim); empty for the token's default
	// agent.
	Claims    claim.Set
	TLSConfig *tls.Config
	MaxFrame  int64
	Keepalive frameconn.Keepalive // PongWait: frameconn.DefaultAgentPongWait
	Handler   Handler
	OnState   func(ConnState) // called from the client's goroutines; must not block
	Logger    *slog.Logger

	// Reconnect backoff: starts at BackoffMin, doubles, capped at
	// BackoffMax, each wait drawn between half and all of it (jitter), so
	// a relay restart is not met by every agent at once.
	BackoffMin time.Duration // 100 ms
	BackoffMax time.Duration // 2 s: a returning relay is found within ~2 s

	// StopGrace bounds how long a stopping agent waits for the requests it
	// holds to be answered (live) or acknowledged (queued) before it
	// closes the connection: 35 s, the relay's default forward timeout
	// and a margin.
	StopGrace time.Duration
}

// Errors that end Client.Run: retrying would not help.
var (
	ErrUnauthorized = errors.New("the relay refused the token") // followed by the relay's reason, when it gives one
	ErrReplaced     = errors.New("another agent connected with the same token and took over the tunnel")
	ErrRevoked      = errors.New("the token was revoked on the relay")
	// ErrClaimRefused: the relay will not seat this agent by its claims
	// (another agent of the token holds one of them, or the token would
	// hold more claims than the relay takes); the relay's message says
	// which.
	ErrClaimRefused = errors.New("the relay refused this agent's claims")
	// ErrClaimsUnknown: the agent claims calls, and the relay's hello
	// holds no claims: a relay older than claims, which would hand this
	// agent the calls of the token's default agent.
	ErrClaimsUnknown = errors.New("the relay does not know claims")
)

// errHeldByNewer is the relay's refusal of this agent run: another,
// started later, holds the tunnel. Unlike a first "replaced", it is the
// relay's final word: asking again would be told the same.
var errHeldByNewer = fmt.Errorf("%w; it started after this one", ErrReplaced)

// errGoingAway is a goaway that leaves the agent free to reconnect.
var errGoingAway = errors.New("the relay is going away")

// relayError is the relay's goaway as an error: it says the relay's
// message when there is one, else kind's text, never both (they say the
// same thing: "took over the tunnel (... took over this tunnel)"), and
// errors.Is finds kind.
type relayError struct {
	kind    error
	message string // the relay's; may be empty
}

func (e *relayError) Error() string {
	if e.message == "" {
		return e.kind.Error()
	}
	return e.message
}

func (e *relayError) Unwrap() error { return e.kind }

// Client is the agent's end of a tunnel: it connects, reconnects with
// backoff, and hands requests to its Handler.
type Client struct {
	cfg    Config
	dialer websocket.Dialer
	wsURLs []string // one per relay node; Run moves to the next when one fails
	log    *slog.Logger

	// instance names this run to the relay on every connection: of two
	// agents with one token it keeps the later, and a reconnect of this
	// one takes its tunnel back.
	instance wire.Instance
}

// NewClient validates cfg.
func NewClient(cfg Config) (*Client, error) {
	var wsURLs []string
	for _, raw := range strings.Split(cfg.RelayURL, ",") {
		ws, err := websocketURL(strings.TrimSpace(raw))
		if err != nil {
			return nil, err
		}
		wsURLs = append(wsURLs, ws)
	}
	if cfg.Handler == nil {
		return nil, errors.New("relay: Config.Handler is required")
	}
	if cfg.MaxFrame <= 0 {
		cfg.MaxFrame = wire.DefaultMaxFrame
	}
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = 100 * time.Millisecond
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = 35 * time.Second
	}
	if cfg.Keepalive.PongWait <= 0 {
		cfg.Keepalive.PongWait = frameconn.DefaultAgentPongWait
	}
	if cfg.OnState == nil {
		cfg.OnState = func(ConnState) {}
	}
	for _, h := range cfg.RequireHeaders {
		if name, _, ok := strings.Cut(h, ":"); !ok || strings.TrimSpace(name) == "" {
			return nil, fmt.Errorf("--require-header %q: want 'Name: value'", h)
		}
	}
	c := &Client{cfg: cfg, wsURLs: wsURLs, log: cfg.Logger, instance: wire.NewInstance()}
	c.dialer = websocket.Dialer{
		Proxy:            http.ProxyFromEnvironment,
		HandshakeTimeout: 10 * time.Second,
		Subprotocols:     []string{wire.Subprotocol},
		TLSClientConfig:  cfg.TLSConfig,
		ReadBufferSize:   32 << 10,
		WriteBufferSize:  32 << 10,
	}
	return c, nil
}

// Run keeps the tunnel connected until ctx ends (nil) or the relay says no
// for good (ErrUnauthorized, ErrReplaced, ErrRevoked, ErrClaimRefused,
// ErrClaimsUnknown).
func (c *Client) Run(ctx context.Context) error {
	attempt := 0
	var replacedAt time.Time
	for next := 0; ; next = (next + 1) % len(c.wsURLs) {
		connected, err := c.connectOnce(ctx, c.wsURLs[next])
		if ctx.Err() != nil {
			c.cfg.OnState(ConnState{State: StateOffline})
			return nil
		}
		if c.final(err, &replacedAt) {
			c.cfg.OnState(ConnState{State: StateOffline, Err: err})
			return err
		}
		if errors.Is(err, ErrReplaced) {
			// Asking once more, at once: the answer is the agent's one
			// line, not a reconnect to show.
			continue
		}
		if connected {
			attempt = 0
		}
		wait := c.backoff(attempt)
		attempt++
		c.log.Warn("relay connection lost; reconnecting", "err", err, "in", wait.Round(time.Millisecond))
		c.cfg.OnState(ConnState{State: StateReconnecting, Err: err})
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			c.cfg.OnState(ConnState{State: StateOffline})
			return nil
		}
	}
}

// final reports whether err ends Run. A first "replaced" does not: the
// agent reconnects once, in case it was a mistake (a relay node that
// misread who holds the tunnel). An agent that really has a twin started
// later is refused at once (errHeldByNewer), and goes; so is one told
// twice by a relay that does not order agent runs.
func (c *Client) final(err error, replacedAt *time.Time) bool {
	if errors.Is(err, ErrReplaced) && !errors.Is(err, errHeldByNewer) && time.Since(*replacedAt) > replacedWindow {
		*replacedAt = time.Now()
		c.log.Debug("told to give the tunnel up; reconnecting once to make sure", "err", err)
		return false
	}
	for _, end := range []error{ErrUnauthorized, ErrReplaced, ErrRevoked, ErrClaimRefused, ErrClaimsUnknown} {
		if errors.Is(err, end) {
			return true
		}
	}
	return false
}

// replacedWindow is how soon a second "replaced" ends the client for good.
const replacedWindow = time.Minute

func (c *Client) backoff(attempt int) time.Duration {
	d := c.cfg.BackoffMin << min(attempt, 20)
	if d > c.cfg.BackoffMax || d <= 0 {
		d = c.cfg.BackoffMax
	}
	return d/2 + rand.N(d/2+1)
}

// connectOnce dials, serves the connection until it ends and reports
// whether the handshake succeeded.
func (c *Client) connectOnce(ctx context.Context, wsURL string) (bool, error) {
	h := http.Header{}
	h.Set("Authorization", "Bearer "+c.cfg.Token)
	h.Set(wire.MaxFrameHeader, strconv.FormatInt(c.cfg.MaxFrame, 10))
	h.Set(wire.InstanceHeader, c.instance.String())
	for _, v := range c.cfg.RequireHeaders {
		h.Add(wire.RequireHeaderHeader, v)
	}
	for _, v := range c.cfg.Claims.Strings() {
		h.Add(wire.ClaimHeader, v)
	}
	dialer := c.dialer
	dialer.NetDialContext = (&net.Dialer{KeepAlive: 30 * time.Second, Resolver: c.cfg.Resolver}).DialContext
	conn, resp, err := frameconn.Dial(ctx, dialer, wsURL, h, c.cfg.MaxFrame, c.cfg.Keepalive)
	if err != nil {
		if resp != nil {
			defer resp.Body.Close()
			return false, refusal(resp.StatusCode, resp.Status, errorMessage(resp.Body))
		}
		return false, err
	}
	cc := &clientConn{Conn: conn, client: c, relayURL: nodeURL(wsURL), left: make(chan struct{})}
	go cc.SendLoop()
	stop := context.AfterFunc(ctx, cc.stop)
	defer stop()
	err = cc.readLoop()
	cc.Close(err)
	return cc.helloSeen, err
}

// refusal is the error of a handshake the relay answered with status
// code (text status) and the error envelope's message msg.
func refusal(code int, status, msg string) error {
	switch code {
	case http.StatusUnauthorized:
		if msg == "" {
			return ErrUnauthorized
		}
		// The reason ("token is not valid or was revoked") says what
		// went wrong; ErrUnauthorized's text, who said so.
		return fmt.Errorf("%w: %s", ErrUnauthorized, msg)
	case http.StatusConflict:
		// The message names the claim and what to do; said after
		// ErrClaimRefused's text it would say the refusal twice.
		return &relayError{kind: ErrClaimRefused, message: oneLine(msg)}
	}
	return fmt.Errorf("relay answered %s: %s", status, msg)
}

// oneLine is msg with its line breaks made spaces: the agent says a
// refusal on one line.
func oneLine(msg string) string {
	return strings.Join(strings.Fields(msg), " ")
}

// nodeURL is the relay URL a node's websocket URL was made from, as the
// agent names the relay to its user.
func nodeURL(wsURL string) string {
	u, err := url.Parse(wsURL)
	if err != nil {
		return wsURL
	}
	u.Scheme = strings.Replace(u.Scheme, "ws", "http", 1)
	u.Path = strings.TrimSuffix(u.Path, wire.ConnectPath)
	return u.String()
}

// websocketURL is where an agent connects on the relay at raw.
func websocketURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("relay URL %q: want http(s)://host[:port]", raw)
	}
	switch u.Scheme {
	case "http", "ws":
		u.Scheme = "ws"
	case "https", "wss":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("relay URL %q: scheme must be http or https", raw)
	}
	u.Path = strings.TrimRight(u.Path, "/") + wire.ConnectPath
	return u.String(), nil
}

// errorMessage pulls the message out of an error envelope, or returns the text.
func errorMessage(r io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(r, 4096))
	var env struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(b, &env) == nil && env.Message != "" {
		return env.Message
	}
	return strings.TrimSpace(string(b))
}

// clientConn is the agent's end of one websocket.
type clientConn struct {
	*frameconn.Conn
	client        *Client
	relayURL      string                      // the node's, as the agent was given it
	helloSeen     bool                        // owned by readLoop
	hello         wire.Hello                  // owned by readLoop: the relay's, once helloSeen
	limits        atomic.Pointer[wire.Limits] // the relay's, from its hello
	knowsTooLarge atomic.Bool                 // the relay understands ResultTooLarge

	// forwardTimeout is the relay's, from its hello; set by readLoop
	// before it hands over any request.
	forwardTimeout time.Duration

	// Stopping: leaveOK is set from the hello of a relay that reads the
	// leave frame; streams counts the requests handed to the Handler and
	// not yet answered (live) or acknowledged (queued); left is closed by
	// readLoop on the relay's goaway "left", after which no request comes.
	leaveOK atomic.Bool
	streams sync.WaitGroup
	left    chan struct{}
}

// stop ends the connection as the agent stops. To a relay that reads
// leave, it first says so (the relay queues what arrives from then on) and
// gives the requests it holds up to StopGrace to be answered: a stop then
// costs no sender an answer its handler gave.
func (cc *clientConn) stop() {
	// The last answers may still be queued behind a busy writer: the
	// close goes after them, else the relay tells their senders the
	// agent left without answering.
	defer cc.Finish(websocket.CloseGoingAway, "agent stopping", context.Canceled)
	if !cc.leaveOK.Load() {
		return
	}
	grace := time.NewTimer(cc.client.cfg.StopGrace)
	defer grace.Stop()
	if cc.Send(frameconn.Frame{Head: wire.AppendLeave(nil, wire.Leave{})}, nil) != nil {
		return
	}
	select {
	case <-cc.left:
	case <-grace.C:
		return
	case <-cc.Done():
		return
	}
	answered := make(chan struct{})
	go func() {
		cc.streams.Wait() // no stream is added after left
		close(answered)
	}()
	select {
	case <-answered:
	case <-grace.C:
		cc.client.log.Warn("stopping before every request held was answered", "grace", cc.client.cfg.StopGrace)
	case <-cc.Done():
	}
}

// sendUnlessClosed sends a frame, written at once or queued, blocking
// while the queue is full; the frame is dropped only with the connection
// (the relay then treats the request as not acknowledged).
func (cc *clientConn) sendUnlessClosed(f frameconn.Frame) {
	cc.Send(f, nil)
}

// readLoop reads the relay's frames until the connection ends or the relay
// sends the agent away, and returns why. Each frame's buffer goes back to
// the pool once read, but a request's, which its Stream releases.
func (cc *clientConn) readLoop() error {
	for {
		buf, err := cc.ReadFrame()
		if err != nil {
			return err
		}
		b := buf.Bytes()
		switch b[0] {
		case wire.FrameRequest:
			err = cc.readRequest(buf)
		case wire.FrameHello:
			err = cc.readHello(b)
			frameconn.PutBuf(buf)
		case wire.FrameNotice:
			err = cc.readNotice(b)
			frameconn.PutBuf(buf)
		case wire.FrameGoAway:
			err = cc.readGoAway(b)
			frameconn.PutBuf(buf)
		default:
			err = fmt.Errorf("%w: unexpected frame type 0x%02x from relay", wire.ErrMalformed, b[0])
			frameconn.PutBuf(buf)
		}
		if err != nil {
			return err
		}
	}
}

// readHello takes the relay's limits and abilities from its hello.
func (cc *clientConn) readHello(b []byte) error {
	if err := wire.DecodeHello(b, &cc.hello); err != nil {
		return err
	}
	hello := &cc.hello
	if len(cc.client.cfg.Claims) > 0 && len(hello.Claims) == 0 {
		// Taking this seat would take the default agent's calls, and
		// its tunnel: leave before the first request is read.
		return &relayError{kind: ErrClaimsUnknown, message: fmt.Sprintf("the relay at %s does not know claims (calltap relay older than this agent); upgrade it", cc.relayURL)}
	}
	cc.helloSeen = true
	l := hello.Limits()
	cc.limits.Store(&l)
	if l.MaxFrame > 0 {
		cc.SetPeerMax(l.MaxFrame)
	}
	// A relay that announces its frame limit is one that knows
	// ResultTooLarge: both came together.
	cc.knowsTooLarge.Store(hello.MaxFrame > 0)
	cc.forwardTimeout = time.Duration(hello.ForwardTimeoutMS) * time.Millisecond
	cc.leaveOK.Store(hello.Leave)
	cc.client.cfg.OnState(ConnState{State: StateConnected, Hello: hello})
	return nil
}

// readRequest hands a request to the Handler, with buf, which its body
// aliases, for the Stream to release; or releases buf and says why the
// request has no place here.
func (cc *clientConn) readRequest(buf *bytes.Buffer) error {
	req, err := cc.decodeRequest(buf.Bytes())
	if err != nil {
		frameconn.PutBuf(buf)
		return err
	}
	cc.streams.Add(1)
	cc.client.cfg.Handler.ServeTunnel(req, &Stream{c: cc, stream: req.Stream, queued: req.Queued, buf: buf})
	return nil
}

// decodeRequest parses a request frame, or says why it has no place here:
// before the hello, or after the goaway that answers our leave.
func (cc *clientConn) decodeRequest(b []byte) (*wire.Request, error) {
	if !cc.helloSeen {
		return nil, fmt.Errorf("%w: request before hello", wire.ErrMalformed)
	}
	req, err := wire.DecodeRequest(b)
	if err != nil {
		return nil, err
	}
	select {
	case <-cc.left:
		return nil, fmt.Errorf("%w: request after goaway left", wire.ErrMalformed)
	default:
	}
	return req, nil
}

// readNotice shows the relay's counters.
func (cc *clientConn) readNotice(b []byte) error {
	var n wire.Notice
	if err := wire.DecodeNotice(b, &n); err != nil {
		return err
	}
	cc.client.cfg.OnState(ConnState{State: StateConnected, Hello: &cc.hello, Notice: n})
	return nil
}

// readGoAway returns why the relay sends the agent away, or nil for its
// answer to our leave, after which the connection stays for the answers.
func (cc *clientConn) readGoAway(b []byte) error {
	g, err := wire.DecodeGoAway(b)
	if err != nil {
		return err
	}
	switch g.Reason {
	case wire.GoAwayLeft:
		select { // sent once, in answer to our leave
		case <-cc.left:
		default:
			close(cc.left)
		}
		return nil
	case wire.GoAwayReplaced:
		return &relayError{kind: ErrReplaced, message: g.Message}
	case wire.GoAwayHeld:
		return &relayError{kind: errHeldByNewer, message: g.Message}
	case wire.GoAwayRevoked:
		return &relayError{kind: ErrRevoked, message: g.Message}
	default:
		// The message says why ("relay shutting down"): said after
		// "relay going away: " it would say it twice.
		return &relayError{kind: errGoingAway, message: g.Message}
	}
}
