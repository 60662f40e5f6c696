package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/crypto/acme/autocert"
)

// CertCache is an autocert.Cache in the calltap_certs bucket, shared by
// every node: the node that obtains a certificate stores it and every node
// serves it, and a TLS-ALPN-01 challenge the CA sends to any node is
// answered from it. Each CA directory has its own keys, as each has its
// own folder on one node.
func (c *Cluster) CertCache(directoryURL string) autocert.Cache {
	sum := sha256.Sum256([]byte(directoryURL))
	return &certCache{kv: c.certs, prefix: hex.EncodeToString(sum[:6]) + "."}
}

type certCache struct {
	kv     jetstream.KeyValue
	prefix string
}

// key makes autocert's names ("example.com+rsa", "acme_account+key")
// into key-value keys, which allow neither "+" nor "*".
func (c *certCache) key(name string) string {
	return c.prefix + base64.RawURLEncoding.EncodeToString([]byte(name))
}

func (c *certCache) Get(ctx context.Context, name string) ([]byte, error) {
	e, err := c.kv.Get(ctx, c.key(name))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, autocert.ErrCacheMiss
	} else if err != nil {
		return nil, err
	}
	return e.Value(), nil
}

func (c *certCache) Put(ctx context.Context, name string, data []byte) error {
	_, err := c.kv.Put(ctx, c.key(name), data)
	return err
}

func (c *certCache) Delete(ctx context.Context, name string) error {
	err := c.kv.Delete(ctx, c.key(name))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	return err
}
