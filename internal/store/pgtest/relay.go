package pgtest

import (
	"net"
	"net/url"
	"path/filepath"
	"sync"
)

// Relay is a TCP relay in front of a cluster's unix socket, for tests of
// a network that stops passing bytes: Freeze holds every byte in both
// directions (connections stay open, new ones are still accepted, nothing
// is answered: a partition neither side is told of); Thaw lets them
// through again.
type Relay struct {
	ln     net.Listener
	target string
	gate   sync.RWMutex // Freeze holds it: every write waits

	mu     sync.Mutex
	conns  []net.Conn // guarded by mu
	closed bool       // guarded by mu
	wg     sync.WaitGroup
}

// NewRelay listens on a loopback port and relays to the cluster that
// clusterURL (a URL of this package's clusters) names. Close it when done.
func NewRelay(clusterURL string) (*Relay, error) {
	p, err := url.Parse(clusterURL)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Relay{ln: ln, target: filepath.Join(p.Query().Get("host"), ".s.PGSQL."+p.Query().Get("port"))}
	r.wg.Go(r.accept)
	return r, nil
}

// URL is clusterURL's database reached through the relay.
func (r *Relay) URL(clusterURL string) (string, error) {
	p, err := url.Parse(clusterURL)
	if err != nil {
		return "", err
	}
	q := p.Query()
	q.Del("host")
	q.Del("port")
	p.Host, p.RawQuery = r.ln.Addr().String(), q.Encode()
	return p.String(), nil
}

func (r *Relay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("unix", r.target)
		if err != nil {
			c.Close()
			continue
		}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			c.Close()
			up.Close()
			return
		}
		r.conns = append(r.conns, c, up)
		r.mu.Unlock()
		r.wg.Go(func() { r.pipe(up, c) })
		r.wg.Go(func() { r.pipe(c, up) })
	}
}

func (r *Relay) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			r.gate.RLock()
			_, werr := dst.Write(buf[:n])
			r.gate.RUnlock()
			if werr != nil {
				src.Close()
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

// Freeze stops every byte until Thaw. Not to be called twice in a row.
func (r *Relay) Freeze() { r.gate.Lock() }

// Thaw lets bytes through again after Freeze.
func (r *Relay) Thaw() { r.gate.Unlock() }

// Close stops listening and closes every relayed connection. Call it
// thawed.
func (r *Relay) Close() {
	r.ln.Close()
	r.mu.Lock()
	r.closed = true
	for _, c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}
