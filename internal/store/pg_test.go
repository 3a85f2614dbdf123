package store_test

import (
	"context"
	"database/sql"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/store"
)

// waitLimit bounds every wait of these tests: reaching it is a failure.
const waitLimit = 20 * time.Second

// pgLockKey is the one-queen advisory lock ("apiary" in ASCII).
const pgLockKey = 0x617069617279

// newPG is a fresh PostgreSQL database of the test cluster.
func newPG(t *testing.T) string {
	t.Helper()
	u, err := pg.NewDatabase(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// admin is a plain connection pool to the database of u, beside the store.
func admin(t *testing.T, u string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// lockHolder is the backend pid holding the one-queen lock of db's
// database.
func lockHolder(t *testing.T, db *sql.DB) int {
	t.Helper()
	var pid int
	err := db.QueryRowContext(t.Context(), `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND objsubid = 1 AND ((classid::int8 << 32) | objid::int8) = $1`, int64(pgLockKey)).Scan(&pid)
	if err != nil {
		t.Fatalf("find the backend holding the one-queen lock: %v", err)
	}
	return pid
}

func terminate(t *testing.T, db *sql.DB, pid int) {
	t.Helper()
	var ok bool
	if err := db.QueryRowContext(t.Context(), "SELECT pg_terminate_backend($1, 10000)", pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d): %v %v", pid, ok, err)
	}
}

func appendEntry(ctx context.Context, s *store.Store, target string) (store.AuditEntry, error) {
	var e store.AuditEntry
	err := s.Update(ctx, func(tx *store.Tx) (err error) {
		e, err = tx.Append(store.AuditEntry{Actor: "queen", Action: "test", Target: target})
		return err
	})
	return e, err
}

// withParams adds query parameters to a database URL.
func withParams(t *testing.T, u string, kv ...string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	q := p.Query()
	for i := 0; i < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	p.RawQuery = q.Encode()
	return p.String()
}

// stallProxy forwards TCP connections to the test cluster's unix socket
// until it is frozen: then it keeps every connection open and passes no
// byte, as a network that stopped answering.
type stallProxy struct {
	ln     net.Listener
	target string
	gate   sync.RWMutex // write-held while frozen
	mu     sync.Mutex
	conns  []net.Conn // guarded by mu
	closed bool       // guarded by mu
	wg     sync.WaitGroup
}

func newStallProxy(t *testing.T, clusterURL string) *stallProxy {
	t.Helper()
	p, err := url.Parse(clusterURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sp := &stallProxy{ln: ln, target: filepath.Join(p.Query().Get("host"), ".s.PGSQL."+p.Query().Get("port"))}
	sp.wg.Go(sp.accept)
	t.Cleanup(sp.close)
	return sp
}

// url is clusterURL's database through the proxy.
func (sp *stallProxy) url(t *testing.T, clusterURL string) string {
	t.Helper()
	p, err := url.Parse(clusterURL)
	if err != nil {
		t.Fatal(err)
	}
	q := p.Query()
	q.Del("host")
	q.Del("port")
	p.Host, p.RawQuery = sp.ln.Addr().String(), q.Encode()
	return p.String()
}

func (sp *stallProxy) accept() {
	for {
		c, err := sp.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("unix", sp.target)
		if err != nil {
			c.Close()
			continue
		}
		sp.mu.Lock()
		if sp.closed {
			sp.mu.Unlock()
			c.Close()
			up.Close()
			return
		}
		sp.conns = append(sp.conns, c, up)
		sp.mu.Unlock()
		sp.wg.Go(func() { sp.pipe(up, c) })
		sp.wg.Go(func() { sp.pipe(c, up) })
	}
}

func (sp *stallProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			sp.gate.RLock()
			_, werr := dst.Write(buf[:n])
			sp.gate.RUnlock()
			if werr != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

func (sp *stallProxy) freeze()   { sp.gate.Lock() }
func (sp *stallProxy) unfreeze() { sp.gate.Unlock() }

func (sp *stallProxy) close() {
	sp.ln.Close()
	sp.mu.Lock()
	sp.closed = true
	for _, c := range sp.conns {
		c.Close()
	}
	sp.mu.Unlock()
	sp.wg.Wait()
}

// mustContain fails unless err's text holds every part.
func mustContain(t *testing.T, err error, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("error %v lacks %q", err, p)
		}
	}
}
