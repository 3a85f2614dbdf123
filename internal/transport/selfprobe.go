package transport

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
)

// ProbeSelf asks a daemon's own listener for path (an open endpoint such
// as /health) and wants 200: proof that its accept loop and handlers
// work, for the service manager's watchdog. An unspecified listen address
// (0.0.0.0, ::) is reached on loopback. With TLS the certificate is not
// checked: the probe goes to this process's own socket, sends no token
// and reads nothing but the status, and the certificate's names need not
// cover the loopback address.
func (s ServerTLS) ProbeSelf(ctx context.Context, addr net.Addr, path string) error {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return fmt.Errorf("probe of %s: not a TCP address", addr)
	}
	host := tcp.IP
	switch {
	case host == nil || host.IsUnspecified() && host.To4() != nil:
		host = net.IPv4(127, 0, 0, 1)
	case host.IsUnspecified():
		host = net.IPv6loopback
	}
	t := &http.Transport{Proxy: nil, DisableKeepAlives: true}
	if s.Enabled() {
		t.TLSClientConfig = &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12} //nolint:gosec // see above
	}
	defer t.CloseIdleConnections()
	u := s.Scheme() + "://" + net.JoinHostPort(host.String(), fmt.Sprint(tcp.Port)) + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := t.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("probe of %s: %w", u, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("probe of %s: %s", u, resp.Status)
	}
	return nil
}
