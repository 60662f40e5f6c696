package wire

import (
	"bytes"
	"reflect"
	"testing"
)

func sampleRequest() *Request {
	return &Request{
		Stream: 42, Queued: true, ArrivedAt: 1763800000123456, ID: "0b6f3c0e-8d5f-4a43-9b1c-2f4e0c1d9a77",
		Method: "POST", URI: "/webhooks/voice?x=1&x=2",
		Header: Header{{"Content-Type", "application/json"}, {"X-Multi", "a"}, {"X-Multi", "b"}},
		Body:   []byte(`{"id":"7b1d3a52","event":"call.ended"}`),
	}
}

func TestRequestRoundTrip(t *testing.T) {
	in := sampleRequest()
	frame := append(AppendRequestHead(nil, in), in.Body...)
	out, err := DecodeRequest(frame)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip:\n in %+v\nout %+v", in, out)
	}
}

func TestResponseRoundTrip(t *testing.T) {
	in := &Response{Stream: 7, Status: 503, Result: ResultOK, Header: Header{{"Retry-After", "5"}}, Body: []byte("busy")}
	out, err := DecodeResponse(append(AppendResponseHead(nil, in), in.Body...))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip:\n in %+v\nout %+v", in, out)
	}
	empty := &Response{Stream: 8, Result: ResultUnreachable, Error: "connection refused", Header: Header{}, Body: []byte{}}
	out, err = DecodeResponse(AppendResponseHead(nil, empty))
	if err != nil || out.Result != ResultUnreachable || out.Error != "connection refused" {
		t.Fatalf("unreachable: %+v %v", out, err)
	}
	out, err = DecodeResponse(AppendResponseHead(nil, &Response{Stream: 9, Result: ResultQueued}))
	if err != nil || out.Result != ResultQueued {
		t.Fatalf("queued: %+v %v", out, err)
	}
	if _, err := DecodeResponse(AppendResponseHead(nil, &Response{Stream: 10, Result: ResultQueued + 1})); err == nil {
		t.Error("a result past ResultQueued: no error")
	}
}

func TestDecodeRejectsMalformed(t *testing.T) {
	good := append(AppendRequestHead(nil, sampleRequest()), "body"...)
	for i := 1; i < len(good)-4; i++ {
		if _, err := DecodeRequest(good[:i]); err == nil {
			t.Errorf("truncated to %d bytes: no error", i)
		}
	}
	// A header count far beyond what the frame could hold.
	bad := []byte{FrameRequest, 1, 0, 1, 0, 4, 'P', 'O', 'S', 'T', 1, '/', 0xff, 0xff, 0xff, 0xff, 0x0f}
	if _, err := DecodeRequest(bad); err == nil {
		t.Error("huge header count: no error")
	}
	if _, err := DecodeResponse([]byte{FrameResponse, 1, 42, 0, 0, 0}); err == nil {
		t.Error("status 42: no error")
	}
	if _, err := DecodeAck([]byte{FrameAck, 1, 0}); err == nil {
		t.Error("trailing bytes after ack: no error")
	}
}

// FuzzDecodeFrame feeds arbitrary bytes to every decoder: none may panic,
// and whatever decodes must encode back to the same bytes.
func FuzzDecodeFrame(f *testing.F) {
	r := sampleRequest()
	f.Add(append(AppendRequestHead(nil, r), r.Body...))
	resp := &Response{Stream: 1, Status: 200, Header: Header{{"A", "b"}}, Body: []byte("ok")}
	f.Add(append(AppendResponseHead(nil, resp), resp.Body...))
	f.Add(AppendAck(nil, Ack{Stream: 99}))
	f.Add(AppendGoAway(nil, GoAway{Reason: GoAwayReplaced, Message: "bye"}))
	f.Add([]byte{FrameRequest, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		if req, err := DecodeRequest(b); err == nil {
			again := append(AppendRequestHead(nil, req), req.Body...)
			if req2, err := DecodeRequest(again); err != nil || !reflect.DeepEqual(req, req2) {
				t.Fatalf("request does not survive re-encoding: %v", err)
			}
		}
		if resp, err := DecodeResponse(b); err == nil {
			again := append(AppendResponseHead(nil, resp), resp.Body...)
			if resp2, err := DecodeResponse(again); err != nil || !reflect.DeepEqual(resp, resp2) {
				t.Fatalf("response does not survive re-encoding: %v", err)
			}
		}
		if s, err := DecodeAck(b); err == nil {
			if s2, err := DecodeAck(AppendAck(nil, s)); err != nil || s2 != s {
				t.Fatalf("ack does not survive re-encoding")
			}
		}
		DecodeGoAway(b)
		var h Hello
		DecodeHello(b, &h)
	})
}

func BenchmarkEncodeRequest(b *testing.B) {
	r := sampleRequest()
	r.Body = bytes.Repeat([]byte("x"), 2048)
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	b.SetBytes(int64(len(r.Body)))
	for b.Loop() {
		buf = AppendRequestHead(buf[:0], r)
	}
}

func BenchmarkDecodeRequest(b *testing.B) {
	r := sampleRequest()
	r.Body = bytes.Repeat([]byte("x"), 2048)
	frame := append(AppendRequestHead(nil, r), r.Body...)
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		if _, err := DecodeRequest(frame); err != nil {
			b.Fatal(err)
		}
	}
}

// Limits.Check measures a response's frame without encoding it: the
// measure must be the encoding's length, to the byte.
func TestResponseHeadLen(t *testing.T) {
	long := string(bytes.Repeat([]byte("v"), 300))
	for _, r := range []*Response{
		{},
		{Stream: 1 << 40, Status: 200, Header: Header{{"Content-Type", "text/plain"}, {"X-Long", long}}},
		{Stream: 7, Result: ResultTooLarge, Error: long},
	} {
		if got, want := responseHeadLen(r), len(AppendResponseHead(nil, r)); got != want {
			t.Errorf("responseHeadLen = %d, encoded head is %d bytes", got, want)
		}
	}
	lim := Limits{MaxBody: 10, MaxFrame: 64}
	if err := lim.Check(&Response{Status: 200, Body: make([]byte, 10)}); err != nil {
		t.Errorf("a body at the limit: %v", err)
	}
	if err := lim.Check(&Response{Status: 200, Body: make([]byte, 11)}); err == nil {
		t.Error("a body over the limit passed")
	}
	if err := lim.Check(&Response{Status: 200, Header: Header{{"X-Long", long}}}); err == nil {
		t.Error("a frame over the limit passed")
	}
}
