package mediasave

import (
	"errors"
	"net"
	"net/http"
	"net/url"
	"syscall"
	"time"
)

// errPrivateAddress refuses a link to the developer's own network.
var errPrivateAddress = errors.New("link points at a loopback or private address (allowed only with the emulator)")

// newClient checks the address actually dialled, after DNS, so that a
// name that resolves to 127.0.0.1 is refused as surely as the literal.
func newClient(allowPrivate bool) *http.Client {
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	if !allowPrivate {
		d.Control = func(network, address string, _ syscall.RawConn) error {
			host, _, err := net.SplitHostPort(address)
			if err != nil {
				return err
			}
			ip := net.ParseIP(host)
			if ip == nil || ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
				ip.IsUnspecified() || ip.IsMulticast() {
				return errPrivateAddress
			}
			return nil
		}
	}
	return &http.Client{Transport: &http.Transport{
		DialContext:           d.DialContext,
		TLSHandshakeTimeout:   30 * time.Second,
		ResponseHeaderTimeout: time.Minute,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		ForceAttemptHTTP2:     true,
	}}
}

// withoutURL drops the URL from net/http's errors: signed links are
// credentials of a sort, and the record already holds the URL.
func withoutURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
