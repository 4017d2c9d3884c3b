// Package certfile serves TLS certificates from files that are replaced
// while the process runs: Envoy Gateway rotates the rate limit service's
// secret, and Kubernetes swaps the mounted files under it. Each handshake
// reads the files again (a few kilobytes; connections are long-lived, so
// handshakes are rare) and parses them only when their bytes changed, so
// a rotated certificate or CA applies from the next connection on, with
// no watcher and no restart.
package certfile

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
)

// KeyPair is a certificate and its key, from two files. Safe for
// concurrent use.
type KeyPair struct {
	certFile, keyFile string

	mu      sync.Mutex // guards the fields below
	certPEM []byte
	keyPEM  []byte
	cert    *tls.Certificate
}

// NewKeyPair reads the pair once, so that a missing or bad file is an
// error at start-up rather than at the first handshake.
func NewKeyPair(certFile, keyFile string) (*KeyPair, error) {
	k := &KeyPair{certFile: certFile, keyFile: keyFile}
	if _, err := k.Get(); err != nil {
		return nil, err
	}
	return k, nil
}

// Get returns the pair as the files hold it now. While the files cannot
// be read or do not match (mid-rotation: one written, not yet the other),
// it keeps returning the last good pair.
func (k *KeyPair) Get() (*tls.Certificate, error) {
	certPEM, err1 := os.ReadFile(k.certFile)
	keyPEM, err2 := os.ReadFile(k.keyFile)
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := errors.Join(err1, err2); err != nil {
		return k.keep(fmt.Errorf("certfile: %w", err))
	}
	if k.cert != nil && bytes.Equal(certPEM, k.certPEM) && bytes.Equal(keyPEM, k.keyPEM) {
		return k.cert, nil
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return k.keep(fmt.Errorf("certfile: %s and %s: %w", k.certFile, k.keyFile, err))
	}
	k.certPEM, k.keyPEM, k.cert = certPEM, keyPEM, &cert
	return k.cert, nil
}

// keep answers a failed read with the last good pair, if any.
func (k *KeyPair) keep(err error) (*tls.Certificate, error) {
	if k.cert != nil {
		return k.cert, nil
	}
	return nil, err
}

// Pool is a set of CA certificates from one PEM file. Safe for concurrent
// use.
type Pool struct {
	file string

	mu   sync.Mutex // guards pem and pool
	pem  []byte
	pool *x509.CertPool
}

// NewPool reads the file once.
func NewPool(file string) (*Pool, error) {
	p := &Pool{file: file}
	if _, err := p.Get(); err != nil {
		return nil, err
	}
	return p, nil
}

// Get returns the pool as the file holds it now (the last good one while
// it cannot be read or holds no certificate).
func (p *Pool) Get() (*x509.CertPool, error) {
	data, err := os.ReadFile(p.file)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil && p.pool != nil && bytes.Equal(data, p.pem) {
		return p.pool, nil
	}
	if err == nil {
		pool := x509.NewCertPool()
		if pool.AppendCertsFromPEM(data) {
			p.pem, p.pool = data, pool
			return pool, nil
		}
		err = fmt.Errorf("certfile: %s holds no PEM certificate", p.file)
	}
	if p.pool != nil {
		return p.pool, nil
	}
	return nil, err
}

// Server is a server's TLS configuration from files: its certificate
// (keys), and, when clientCAs is not nil, the CAs client certificates
// must be signed by, a client without one refused. clientSAN, when not
// empty, is a name the client certificate must carry. Both are read again
// at every handshake.
func Server(keys *KeyPair, clientCAs *Pool, clientSAN string, minVersion uint16) *tls.Config {
	base := &tls.Config{
		MinVersion:     minVersion,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return keys.Get() },
	}
	if clientCAs == nil {
		return base
	}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		pool, err := clientCAs.Get()
		if err != nil {
			return nil, err
		}
		c := base.Clone()
		c.GetConfigForClient = nil
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
		if clientSAN != "" {
			c.VerifyConnection = func(cs tls.ConnectionState) error {
				return hasSAN(cs.PeerCertificates, clientSAN)
			}
		}
		return c, nil
	}
	return base
}

// Client is a client's TLS configuration from files: its certificate
// (keys; nil: none), and the CAs the server's must be signed by (nil: the
// system's), for serverName. Both are read again at every handshake.
func Client(keys *KeyPair, roots *Pool, serverName string, minVersion uint16) *tls.Config {
	c := &tls.Config{MinVersion: minVersion, ServerName: serverName}
	if keys != nil {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return keys.Get() }
	}
	if roots == nil {
		return c
	}
	// The standard verification, against the pool as the file holds it
	// at this handshake: crypto/tls offers no hook for the roots alone.
	c.InsecureSkipVerify = true
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		pool, err := roots.Get()
		if err != nil {
			return err
		}
		if len(cs.PeerCertificates) == 0 {
			return errors.New("certfile: the server presented no certificate")
		}
		opts := x509.VerifyOptions{Roots: pool, DNSName: cs.ServerName, Intermediates: x509.NewCertPool()}
		for _, ic := range cs.PeerCertificates[1:] {
			opts.Intermediates.AddCert(ic)
		}
		_, err = cs.PeerCertificates[0].Verify(opts)
		return err
	}
	return c
}

// hasSAN reports whether the leaf certificate carries name as a DNS, URI
// or email SAN.
func hasSAN(chain []*x509.Certificate, name string) error {
	if len(chain) == 0 {
		return errors.New("certfile: no client certificate")
	}
	leaf := chain[0]
	for _, d := range leaf.DNSNames {
		if d == name {
			return nil
		}
	}
	for _, u := range leaf.URIs {
		if u.String() == name {
			return nil
		}
	}
	for _, e := range leaf.EmailAddresses {
		if e == name {
			return nil
		}
	}
	return fmt.Errorf("certfile: the client certificate does not carry the SAN %q", name)
}
