package transport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// CAFileEnv names a PEM file of certificate authorities that every apiary
// client trusts besides the system's roots: the CA of a cluster's own
// certificates.
const CAFileEnv = "APIARY_CA_FILE"

// caFile, when set by SetCAFile before the first client is made, takes
// the place of $APIARY_CA_FILE.
var caFile string

// SetCAFile names the CA file (a --ca-file flag) instead of
// $APIARY_CA_FILE; it must be called before any client is made.
func SetCAFile(path string) { caFile = path }

// CAFile is the CA file clients trust besides the system roots: the one
// SetCAFile named, else $APIARY_CA_FILE; "" for none.
func CAFile() string {
	if caFile != "" {
		return caFile
	}
	return os.Getenv(CAFileEnv)
}

// The client TLS settings, loaded once per CA file.
var (
	clientMu   sync.Mutex
	clientPath string      // guarded by clientMu; the file clientCfg holds
	clientCfg  *tls.Config // guarded by clientMu; nil: not loaded
	clientErr  error       // guarded by clientMu
)

// clientTLS returns the client TLS settings for CAFile, loading them the
// first time that file is asked for.
func clientTLS() (*tls.Config, error) {
	path := CAFile()
	clientMu.Lock()
	defer clientMu.Unlock()
	if (clientCfg == nil && clientErr == nil) || path != clientPath {
		clientPath = path
		clientCfg, clientErr = loadClientTLS(path)
	}
	return clientCfg, clientErr
}

// loadClientTLS is the client side's TLS: the system roots plus the PEM
// certificates in caFile, when given.
func loadClientTLS(caFile string) (*tls.Config, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", CAFileEnv, err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s %s holds no PEM certificate", CAFileEnv, caFile)
		}
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// CheckClientTLS loads the client TLS settings (APIARY_CA_FILE) once and
// reports what is wrong with them, so that a daemon fails at its start
// instead of at its first call.
func CheckClientTLS() error {
	if CAFile() == "" {
		return nil // the system roots alone, read at the first handshake
	}
	_, err := clientTLS()
	return err
}

// ServerTLS holds a server's certificate and key files; the zero value
// serves plain HTTP.
type ServerTLS struct {
	CertFile string
	KeyFile  string
}

// Enabled reports whether both files are set.
func (s ServerTLS) Enabled() bool { return s.CertFile != "" && s.KeyFile != "" }

// Scheme is "https" with TLS, "http" without.
func (s ServerTLS) Scheme() string {
	if s.Enabled() {
		return "https"
	}
	return "http"
}

// Validate says what is wrong: one file without the other, or a pair that
// does not load.
func (s ServerTLS) Validate() error {
	switch {
	case s.CertFile == "" && s.KeyFile == "":
		return nil
	case s.CertFile == "" || s.KeyFile == "":
		return errors.New("TLS needs both a certificate and a key file")
	}
	_, err := tls.LoadX509KeyPair(s.CertFile, s.KeyFile)
	if err != nil {
		return fmt.Errorf("TLS certificate %s and key %s: %w", s.CertFile, s.KeyFile, err)
	}
	return nil
}

// Listen wraps ln in TLS when s is enabled; a client that speaks plain
// HTTP to it gets no answer but a failed handshake (net/http answers such
// a request with 400 and closes). The certificate files are read again
// when they change, so a renewed certificate needs no restart.
func (s ServerTLS) Listen(ln net.Listener) (net.Listener, error) {
	if !s.Enabled() {
		return ln, nil
	}
	c, err := newCertReloader(s.CertFile, s.KeyFile)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: c.get, NextProtos: []string{"http/1.1"}}
	return tls.NewListener(ln, cfg), nil
}

// certReloader serves the certificate in its files, reloading them when
// their modification time changes (checked at most once a second).
type certReloader struct {
	certFile, keyFile string

	mu      sync.Mutex // guards the fields below
	cert    *tls.Certificate
	mtime   time.Time
	checked time.Time
}

func newCertReloader(certFile, keyFile string) (*certReloader, error) {
	c := &certReloader{certFile: certFile, keyFile: keyFile}
	if err := c.load(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *certReloader) load() error {
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("TLS certificate %s and key %s: %w", c.certFile, c.keyFile, err)
	}
	st, err := os.Stat(c.certFile)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.cert, c.mtime, c.checked = &cert, st.ModTime(), time.Now()
	c.mu.Unlock()
	return nil
}

func (c *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	cert, due, mtime := c.cert, time.Since(c.checked) > time.Second, c.mtime
	if due {
		c.checked = time.Now()
	}
	c.mu.Unlock()
	if due {
		if st, err := os.Stat(c.certFile); err == nil && !st.ModTime().Equal(mtime) {
			// A failed reload keeps serving the old pair.
			_ = c.load()
			c.mu.Lock()
			cert = c.cert
			c.mu.Unlock()
		}
	}
	return cert, nil
}

// NewTransport is the HTTP transport of every apiary client: the client
// TLS settings, no proxy (daemons reach each other directly), bounded
// dial, handshake and idle times.
func NewTransport() *http.Transport {
	t := &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: 0,
	}
	if CAFile() == "" {
		// The system roots alone: nil RootCAs makes crypto/tls read them at
		// the first handshake, not here. Reading them costs tens of
		// milliseconds, which every worker's and engine front's start
		// paid though most never dial TLS (a model switch waits for it).
		t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		return t
	}
	cfg, err := clientTLS()
	if err != nil {
		// CheckClientTLS refuses to start with it; a caller that did not
		// check gets the reason on every https call.
		t.DialTLSContext = func(context.Context, string, string) (net.Conn, error) { return nil, err }
		return t
	}
	t.TLSClientConfig = cfg.Clone()
	return t
}

// NewClient is an HTTP client on t (NewTransport when nil) with a total
// time limit per request (none when 0) that never follows a redirect: a
// 3xx answer is returned as it is. apiary's daemons call each other at
// checked URLs only, and a redirect must not take a request, and its
// bearer token, elsewhere.
func NewClient(t *http.Transport, timeout time.Duration) *http.Client {
	if t == nil {
		t = NewTransport()
	}
	return &http.Client{Transport: t, Timeout: timeout, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
}
