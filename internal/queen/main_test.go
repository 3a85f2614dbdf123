package queen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/store"
	"github.com/apiary-llm/apiary/internal/store/pgtest"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testnodes"
)

var pg *pgtest.Cluster

func TestMain(m *testing.M) {
	var err error
	pg, err = pgtest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: the queen's PostgreSQL tests need a throwaway cluster:", err)
		os.Exit(1)
	}
	code := m.Run()
	// Keep-alive connections the tests' clients left idle in the default
	// transport (to daemons testbin.Cleanup stops below) are no leak of
	// the code under test; every other goroutine left is.
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	if code == 0 {
		// A connection whose server closed as the last tests ended may
		// take its client a moment to notice (goleak's own retries last
		// about a second): what still runs after 5 s is a leak.
		err := goleak.Find()
		for i := 0; err != nil && i < 5; i++ {
			time.Sleep(time.Second)
			err = goleak.Find()
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "goleak: Errors on successful test run: %v\n", err)
			code = 1
		}
	}
	if err := pg.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	if err := sshNodes.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	testbin.Cleanup()
	os.Exit(code)
}

// waitLimit bounds every wait: reaching it fails the test.
const waitLimit = 20 * time.Second

// backend is where a test queen keeps its state.
type backend struct {
	name string
	// new returns the Config fields of a fresh database.
	new func(t *testing.T) (dataDir, url string)
}

var backends = []backend{
	{"sqlite", func(t *testing.T) (string, string) { return t.TempDir(), "" }},
	{"postgres", func(t *testing.T) (string, string) {
		url, err := pg.NewDatabase(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return "", url
	}},
}

func eachBackend(t *testing.T, fn func(t *testing.T, b backend)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { fn(t, b) })
	}
}

// logWatch is a slog.Handler that keeps every record of an in-process
// queen as a JSON line in a testbin.Lines (as a daemon's stderr is kept),
// so a test waits for a record instead of sleeping.
type logWatch struct {
	*testbin.Lines
	attrs []slog.Attr
}

func newLogWatch() *logWatch { return &logWatch{Lines: testbin.NewLines()} }

func (l *logWatch) Enabled(context.Context, slog.Level) bool { return true }

func (l *logWatch) Handle(_ context.Context, r slog.Record) error {
	m := map[string]any{"time": r.Time.Format("15:04:05.000"), "level": r.Level.String(), "msg": r.Message}
	for _, a := range l.attrs {
		m[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	line, err := json.Marshal(m)
	if err != nil {
		return err
	}
	l.Add(string(line))
	return nil
}

func (l *logWatch) WithAttrs(as []slog.Attr) slog.Handler {
	return &logWatch{Lines: l.Lines, attrs: append(slices.Clone(l.attrs), as...)}
}

func (l *logWatch) WithGroup(string) slog.Handler { return l }

// wait is Lines.Wait with the queen tests' limit.
func (l *logWatch) wait(t testing.TB, from int, msg string, want map[string]string) (testbin.Record, int) {
	t.Helper()
	return l.Wait(t, from, msg, want)
}

// fakeHive is the queen's HiveClient in tests: it records calls and
// answers as told.
type fakeHive struct {
	mu       sync.Mutex
	starts   []api.StartWorkerRequest // guarded by mu
	stops    []string                 // guarded by mu; worker ids
	startErr error                    // guarded by mu
	stopErr  error                    // guarded by mu
	seq      int                      // guarded by mu
	onStart  func(api.StartWorkerRequest)
	stopped  chan string
}

func newFakeHive() *fakeHive { return &fakeHive{stopped: make(chan string, 64)} }

func (f *fakeHive) StartWorker(_ context.Context, _ string, req api.StartWorkerRequest) (api.StartWorkerResponse, error) {
	if f.onStart != nil {
		f.onStart(req)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.starts = append(f.starts, req)
	if f.startErr != nil {
		return api.StartWorkerResponse{}, f.startErr
	}
	f.seq++
	return api.StartWorkerResponse{WorkerID: fmt.Sprintf("worker-%d", f.seq), Status: "starting"}, nil
}

func (f *fakeHive) StopWorker(_ context.Context, _, workerID string, _ api.StopWorkerRequest) error {
	f.mu.Lock()
	f.stops = append(f.stops, workerID)
	err := f.stopErr
	f.mu.Unlock()
	f.stopped <- workerID
	return err
}

func (f *fakeHive) set(startErr, stopErr error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.startErr, f.stopErr = startErr, stopErr
}

// waitStop returns the next worker id the queen asked to stop.
func (f *fakeHive) waitStop(t testing.TB) string {
	t.Helper()
	select {
	case id := <-f.stopped:
		return id
	case <-time.After(waitLimit):
		t.Fatalf("no stop within %s", waitLimit)
		return ""
	}
}

// tq is a queen under test, in this process.
type tq struct {
	t    testing.TB
	q    *Queen
	url  string
	cfg  Config
	hive *fakeHive
	logs *logWatch
	hc   *http.Client
}

// startQueen runs a queen on b's fresh database (or, with cfg.DataDir or
// cfg.DatabaseURL set by a mod, on that one) with a fake hive.
func startQueen(t testing.TB, dataDir, url string, mods ...func(*Config)) *tq {
	t.Helper()
	logs := newLogWatch()
	cfg := Config{Addr: "127.0.0.1:0", DataDir: dataDir, DatabaseURL: url, HeartbeatTimeout: 10 * time.Second,
		FlushInterval: 50 * time.Millisecond, Logger: slog.New(logs)}
	hive := newFakeHive()
	cfg.Hives = hive
	for _, m := range mods {
		m(&cfg)
	}
	q, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- q.Run(context.Background()) }()
	select {
	case <-q.Ready():
	case err := <-errc:
		t.Fatalf("queen did not start: %v", err)
	}
	x := &tq{t: t, q: q, url: q.URL(), cfg: cfg, hive: hive, logs: logs, hc: &http.Client{Timeout: waitLimit}}
	t.Cleanup(func() {
		q.Close()
		if err := <-errc; err != nil {
			t.Errorf("queen Run: %v", err)
		}
		x.hc.CloseIdleConnections()
	})
	return x
}

// do sends a request and returns the status and body.
func (x *tq) do(method, path, token string, body any) (int, []byte) {
	x.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			x.t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, x.url+path, rd)
	if err != nil {
		x.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if method != http.MethodGet {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := x.hc.Do(req)
	if err != nil {
		x.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}

// ok sends a request that must answer want, and decodes the answer.
func (x *tq) ok(method, path string, body any, want int, out any) {
	x.t.Helper()
	token := x.cfg.Tokens.Admin
	switch {
	case path == "/v2/pools/register", strings.HasSuffix(path, "/heartbeat"), strings.HasPrefix(path, "/v2/internal/"):
		token = x.cfg.Tokens.Cluster
	case strings.HasPrefix(path, "/v1/"):
		token = x.cfg.Tokens.API
	}
	status, data := x.do(method, path, token, body)
	if status != want {
		x.t.Fatalf("%s %s: %d %s, want %d", method, path, status, data, want)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			x.t.Fatalf("%s %s: %v in %s", method, path, err, data)
		}
	}
}

// fakeEndpoint is pool id's endpoint where the fake hive answers for
// every pool (each pool has its own: the queen refuses a second live pool
// at one). Nothing dials it.
// fakeEndpoint is the endpoint of pool id's hive in tests whose hives do
// not answer: one address of its own a pool (a queen refuses two pools on
// one endpoint), on loopback, where nothing listens on port 1: a call is
// refused at once, with no name to look up.
func fakeEndpoint(id string) string {
	fakeEndpoints.mu.Lock()
	defer fakeEndpoints.mu.Unlock()
	n, ok := fakeEndpoints.byID[id]
	if !ok {
		if fakeEndpoints.byID == nil {
			fakeEndpoints.byID = map[string]int{}
		}
		n = len(fakeEndpoints.byID)
		fakeEndpoints.byID[id] = n
	}
	return fmt.Sprintf("http://127.0.%d.%d:1", n/250, n%250+2)
}

var fakeEndpoints struct {
	mu   sync.Mutex
	byID map[string]int
}

func (x *tq) register(id string) {
	x.t.Helper()
	x.ok("POST", "/v2/pools/register", api.RegisterPool{PoolID: id, Endpoint: fakeEndpoint(id), NodeID: id, Version: "t",
		GPUs: []api.GPU{{ID: 0, Kind: "cpu", TotalBytes: 8 << 30, FreeBytes: 4 << 30}}}, http.StatusOK, nil)
}

func (x *tq) beat(id string, workers ...api.Worker) {
	x.t.Helper()
	if workers == nil {
		workers = []api.Worker{}
	}
	x.ok("POST", "/v2/pools/"+id+"/heartbeat", api.Heartbeat{GPUs: []api.GPU{{ID: 0, Kind: "cpu", TotalBytes: 8 << 30, FreeBytes: 4 << 30}}, Workers: workers}, http.StatusOK, nil)
}

func (x *tq) event(ev api.WorkerEvent) api.EventAck {
	x.t.Helper()
	var ack api.EventAck
	x.ok("POST", "/v2/internal/workers/events", ev, http.StatusOK, &ack)
	return ack
}

func (x *tq) start(model, pool string) api.AdminWorkerResponse {
	x.t.Helper()
	var resp api.AdminWorkerResponse
	x.ok("POST", "/api/admin/workers", api.AdminWorkerRequest{Action: "start", Model: model, PoolID: pool, Reason: "test"}, http.StatusCreated, &resp)
	return resp
}

func (x *tq) row(id string) api.LifecycleRow {
	x.t.Helper()
	var r api.LifecycleRow
	x.ok("GET", "/api/admin/workers/"+id, nil, http.StatusOK, &r)
	return r
}

func (x *tq) pool(id string) api.Pool {
	x.t.Helper()
	var p api.Pool
	x.ok("GET", "/v2/pools/"+id, nil, http.StatusOK, &p)
	return p
}

// audit returns the actions of target's audit entries, oldest first.
func (x *tq) audit(target string) []string {
	x.t.Helper()
	var out api.AuditList
	x.ok("GET", "/api/admin/audit?target="+target, nil, http.StatusOK, &out)
	var actions []string
	for i := len(out.Entries) - 1; i >= 0; i-- {
		actions = append(actions, out.Entries[i].Action)
	}
	return actions
}

// storeRows reads every row straight from the store.
func (x *tq) storeRows() []store.Row {
	x.t.Helper()
	var rows []store.Row
	if err := x.q.st.View(context.Background(), func(tx *store.Tx) (err error) { rows, err = tx.Rows(store.RowFilter{}); return err }); err != nil {
		x.t.Fatal(err)
	}
	return rows
}

// worker is a hive's report of a worker.
func worker(id, lifecycleID, status string) api.Worker {
	return api.Worker{WorkerID: id, LifecycleID: lifecycleID, ModelRef: "tiny", Status: status, PID: 100,
		URI: "http://127.0.0.1:8001", VRAMBytes: 1 << 20, StartedAt: time.Now().UTC()}
}

func sqliteDir(t testing.TB) string { return filepath.Join(t.TempDir(), "queen") }

// startOn runs a test queen on a fresh database of b.
func startOn(t *testing.T, b backend, mods ...func(*Config)) *tq {
	t.Helper()
	dir, url := b.new(t)
	return startQueen(t, dir, url, mods...)
}

// sshNodes are the queen tests' SSH nodes: their own prefix and subnet,
// apart from internal/sshnode's; TestMain takes them down.
var sshNodes = testnodes.Lazy{Prefix: "apq", Subnet: "10.79.0", N: 2}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
