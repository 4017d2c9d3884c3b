package sidecar

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/extauthz/extauthz/internal/certfile"
	"github.com/extauthz/extauthz/internal/config"
)

// ClientTLS builds a client TLS configuration: for connecting to Redis, and
// for `extauthz check` against a TLS listener.
func ClientTLS(c *config.ClientTLS) (*tls.Config, error) {
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         c.ServerName,
		InsecureSkipVerify: c.InsecureSkipVerify, // opt-in, warned about by validation
	}
	if c.CAFile != "" {
		pool, err := loadPool(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		tc.RootCAs = pool
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// serverTLS builds the gRPC listener's TLS configuration; with a client CA
// file, clients must present a certificate it signed (mTLS), carrying
// ClientSAN when one is set. The files are read again at each handshake,
// so a certificate rotated on disk applies without a restart.
func serverTLS(c *config.ServerTLS) (*tls.Config, error) {
	keys, err := certfile.NewKeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("listen.tls.cert_file/key_file: %w", err)
	}
	var cas *certfile.Pool
	if c.ClientCAFile != "" {
		if cas, err = certfile.NewPool(c.ClientCAFile); err != nil {
			return nil, fmt.Errorf("listen.tls.client_ca_file: %w", err)
		}
	}
	return certfile.Server(keys, cas, c.ClientSAN, tls.VersionTLS12), nil
}

func loadPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificates", file)
	}
	return pool, nil
}
