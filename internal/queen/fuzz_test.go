package queen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/registry"
)

// The fuzz targets send any bytes to the queen's real handlers for what a
// hive sends: registration, heartbeats and worker events. Each target
// keeps one in-process queen on SQLite, or on PostgreSQL with
// APIARY_FUZZ_STORE=postgres (replaced every fuzzRecycle inputs), and
// calls its handler directly, without the network. For every
// input the queen must not panic, must answer below 500 (the input is the
// client's: bad input is a 400 that names the field), must answer every
// refusal as {"error":{"code","message"}}, and whatever it keeps and shows
// again (GET /v2/pools, GET /api/admin/workers) must be free of control
// characters, which would reach an operator's terminal through
// `apiary pools` and `apiary workers`.
//
// `go test` runs the seeds below and the inputs under testdata/fuzz; to
// fuzz one target for minutes:
//
//	go test -run '^$' -fuzz '^FuzzHeartbeat$' -fuzztime 5m -parallel 1 ./internal/queen/

const (
	fuzzPool   = "fuzz-pool"   // the pool heartbeats and events are for
	fuzzWorker = "fuzz-worker" // the hive worker id of every row's worker
	// fuzzLifecycle, anywhere in an input, is replaced by the lifecycle id
	// of fuzzPool's live row: ids are random, and inputs must reach the
	// row code.
	fuzzLifecycle = "LIFECYCLE_ID"
	// fuzzRecycle is how many inputs one queen takes before a fresh one
	// replaces it: it keeps the lists each input reads short.
	fuzzRecycle = 500
	// fuzzStoreEnv=postgres puts the fuzz queens on PostgreSQL (a fresh
	// database each, in the package's throwaway cluster); by default they
	// are on SQLite.
	fuzzStoreEnv = "APIARY_FUZZ_STORE"
)

// fuzzHive accepts every start and stop and has no models, at once.
type fuzzHive struct{}

func (fuzzHive) StartWorker(context.Context, string, api.StartWorkerRequest) (api.StartWorkerResponse, error) {
	return api.StartWorkerResponse{WorkerID: fuzzWorker, Status: "starting"}, nil
}

func (fuzzHive) StopWorker(context.Context, string, string, api.StopWorkerRequest) error { return nil }

func (fuzzHive) Models(context.Context, string) ([]api.Model, error) { return nil, nil }

// errorLog is a slog.Handler that keeps the last few error records of a
// fuzz queen (at most 8), for the message of a failed input.
type errorLog struct {
	mu   sync.Mutex
	last []string // guarded by mu
}

func (l *errorLog) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelError }

func (l *errorLog) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%q", a.Key, a.Value.String()); return true })
	l.mu.Lock()
	defer l.mu.Unlock()
	l.last = append(l.last, b.String())
	if len(l.last) > 8 {
		l.last = l.last[len(l.last)-8:]
	}
	return nil
}

func (l *errorLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *errorLog) WithGroup(string) slog.Handler      { return l }

func (l *errorLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.last) == 0 {
		return "(no errors logged)"
	}
	return strings.Join(l.last, "\n")
}

// fuzzQueen is the queen one fuzz target's inputs go to.
type fuzzQueen struct {
	q    *Queen
	h    http.Handler
	dir  string
	errc chan error
	log  *errorLog
	n    int    // inputs this queen took
	lid  string // fuzzPool's live row, "" before the first
}

func newFuzzQueen(f *testing.F) *fuzzQueen {
	fq := &fuzzQueen{}
	if err := fq.start(); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		if err := fq.stop(); err != nil {
			f.Error(err)
		}
	})
	return fq
}

func (fq *fuzzQueen) start() error {
	dir, err := os.MkdirTemp("", "apiary-fuzz-queen-")
	if err != nil {
		return err
	}
	cfg := Config{Addr: "127.0.0.1:0", DataDir: dir, HeartbeatTimeout: time.Hour, FlushInterval: time.Second, Hives: fuzzHive{}}
	switch s := os.Getenv(fuzzStoreEnv); s {
	case "", "sqlite":
	case "postgres":
		if cfg.DatabaseURL, err = pg.NewDatabase(context.Background()); err != nil {
			return err
		}
		cfg.DataDir = ""
	default:
		return fmt.Errorf("$%s=%q: want sqlite or postgres", fuzzStoreEnv, s)
	}
	log := &errorLog{}
	cfg.Logger = slog.New(log)
	q, err := New(cfg)
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- q.Run(context.Background()) }()
	select {
	case <-q.Ready():
	case err := <-errc:
		return fmt.Errorf("fuzz queen did not start: %w", err)
	}
	*fq = fuzzQueen{q: q, h: q.routes(), dir: dir, errc: errc, log: log}
	return nil
}

func (fq *fuzzQueen) stop() error {
	fq.q.Close()
	err := <-fq.errc
	if rerr := os.RemoveAll(fq.dir); err == nil {
		err = rerr
	}
	return err
}

// next counts one input, first replacing the queen when it took
// fuzzRecycle.
func (fq *fuzzQueen) next(t *testing.T) {
	t.Helper()
	if fq.n >= fuzzRecycle {
		if err := fq.stop(); err != nil {
			t.Fatal(err)
		}
		if err := fq.start(); err != nil {
			t.Fatal(err)
		}
	}
	fq.n++
}

// do serves one request; target is a path, escaped.
func (fq *fuzzQueen) do(method, target string, body []byte) (int, []byte) {
	req := httptest.NewRequest(method, target, bytes.NewReader(body))
	// As a hive on this machine sends it.
	req.Host, req.RemoteAddr = fq.q.Addr().String(), "127.0.0.1:40000"
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := httptest.NewRecorder()
	fq.h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.Bytes()
}

// send serves a request whose body is the client's input and checks the
// answer's status and shape.
func (fq *fuzzQueen) send(t *testing.T, method, target string, body []byte) (int, []byte) {
	t.Helper()
	status, answer := fq.do(method, target, body)
	if status >= 500 {
		t.Fatalf("%s %s answered %d %s to the client's input %q: bad input is a 4xx\nqueen log:\n%s", method, target, status, answer, body, fq.log)
	}
	if status >= 400 {
		var e api.Error
		if err := decodeStrict(answer, &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
			t.Fatalf("%s %s answered %d %q, not {\"error\":{\"code\",\"message\"}} (%v)", method, target, status, answer, err)
		}
	}
	return status, answer
}

// ok serves a request of the harness that must answer want.
func (fq *fuzzQueen) ok(t *testing.T, method, target string, body any, want int, out any) []byte {
	t.Helper()
	var data []byte
	if body != nil {
		var err error
		if data, err = json.Marshal(body); err != nil {
			t.Fatal(err)
		}
	}
	status, answer := fq.do(method, target, data)
	if status != want {
		t.Fatalf("%s %s: %d %s, want %d\nqueen log:\n%s", method, target, status, answer, want, fq.log)
	}
	if out != nil {
		if err := decodeStrict(answer, out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, target, err, answer)
		}
	}
	return answer
}

// shown checks that the answer to GET target has no control character in
// any string.
func (fq *fuzzQueen) shown(t *testing.T, target string, input []byte) {
	t.Helper()
	answer := fq.ok(t, "GET", target, nil, http.StatusOK, nil)
	var v any
	if err := json.Unmarshal(answer, &v); err != nil {
		t.Fatalf("GET %s: %v in %s", target, err, answer)
	}
	if where, s, found := controlIn(v, ""); found {
		t.Fatalf("GET %s shows %s = %q, with a control character, from the input %q", target, where, s, input)
	}
}

// prepare registers fuzzPool unless it is healthy, and makes sure it has
// a live row; it returns the row's lifecycle id.
func (fq *fuzzQueen) prepare(t *testing.T) string {
	t.Helper()
	if p, ok := fq.q.reg.Get(fuzzPool); !ok || p.Status != registry.Healthy {
		fq.ok(t, "POST", "/v2/pools/register", api.RegisterPool{PoolID: fuzzPool, Endpoint: "http://127.0.0.1:1", NodeID: fuzzPool,
			Version: "fuzz", GPUs: []api.GPU{{ID: 0, Kind: "cpu", TotalBytes: 8 << 30, FreeBytes: 4 << 30}}}, http.StatusOK, nil)
	}
	if fq.lid != "" {
		if r, err := fq.q.rows.get(t.Context(), fq.lid); err == nil && !r.Status.Terminal() {
			return fq.lid
		}
	}
	var resp api.AdminWorkerResponse
	fq.ok(t, "POST", "/api/admin/workers", api.AdminWorkerRequest{Action: "start", Model: "tiny", PoolID: fuzzPool, Reason: "fuzz"},
		http.StatusCreated, &resp)
	fq.lid = resp.LifecycleID
	return fq.lid
}

func decodeStrict(data []byte, out any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("more than one JSON value")
	}
	return nil
}

// controlIn finds a string in v (decoded JSON) with a control character:
// C0 (which holds ESC), DEL, or C1 (which holds CSI).
func controlIn(v any, at string) (where, s string, found bool) {
	switch v := v.(type) {
	case string:
		if strings.IndexFunc(v, isControl) >= 0 {
			return at, v, true
		}
	case []any:
		for i, e := range v {
			if where, s, found := controlIn(e, fmt.Sprintf("%s[%d]", at, i)); found {
				return where, s, true
			}
		}
	case map[string]any:
		for k, e := range v {
			if where, s, found := controlIn(e, at+"."+k); found {
				return where, s, true
			}
		}
	}
	return "", "", false
}

func isControl(r rune) bool { return r < 0x20 || r >= 0x7f && r <= 0x9f }

// mustJSON encodes seeds.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// The seeds' worker, as the hive reports it: the row's worker in the
// shape of the queen tests' worker().
func fuzzSeedWorker(status string) api.Worker {
	return api.Worker{WorkerID: fuzzWorker, LifecycleID: fuzzLifecycle, ModelRef: "tiny", Status: status, PID: 100,
		URI: "http://127.0.0.1:8001", VRAMBytes: 1 << 20, StartedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

var fuzzSeedGPUs = []api.GPU{{ID: 0, Kind: "cpu", TotalBytes: 8 << 30, FreeBytes: 4 << 30}}

// junkSeeds are bodies no endpoint accepts.
var junkSeeds = []string{
	``, ` `, `null`, `[]`, `{}`, `"x"`, `1e999`, `{} {}`, `{}x`, `{"a":`, "\x00", "{\x1b}",
	strings.Repeat("[", 10001), `{"x":` + strings.Repeat(`{"y":`, 500) + `1` + strings.Repeat(`}`, 501),
}

func FuzzRegister(f *testing.F) {
	valid := api.RegisterPool{PoolID: "a", Endpoint: "http://127.0.0.1:1", NodeID: "a", Version: "t", GPUs: fuzzSeedGPUs}
	f.Add(mustJSON(valid))
	manyGPUs := func(n int) []byte {
		r := valid
		r.GPUs = make([]api.GPU, n)
		for i := range r.GPUs {
			r.GPUs[i] = api.GPU{ID: i, Kind: "cuda", Name: "NVIDIA H100", TotalBytes: 80 << 30, FreeBytes: 1 << 30}
		}
		return mustJSON(r)
	}
	f.Add(manyGPUs(maxGPUs))
	f.Add(manyGPUs(maxGPUs + 1))
	for _, s := range []string{
		`{"pool_id":"gpu-1","endpoint":"https://node-1.example:8081/","node_id":"node-1","version":"0.4.0","gpus":[{"id":0,"kind":"cuda","name":"NVIDIA H100 80GB HBM3","uuid":"GPU-8f6c","total_vram_bytes":85899345920,"free_vram_bytes":80000000000,"allocated_vram_bytes":1,"reserved_vram_bytes":2,"temperature_c":41,"workers":["w1"]}]}`,
		`{"pool_id":"a","endpoint":"http://h:1","gpus":null}`,
		`{"pool_id":"a","endpoint":"http://h:1","node_id":"","version":""}`,
		// Huge and negative numbers.
		`{"pool_id":"a","endpoint":"http://h:1","gpus":[{"id":9223372036854775807,"total_vram_bytes":18446744073709551615,"free_vram_bytes":18446744073709551615,"temperature_c":-9223372036854775808}]}`,
		`{"pool_id":"a","endpoint":"http://h:1","gpus":[{"id":-1}]}`,
		`{"pool_id":"a","endpoint":"http://h:1","gpus":[{"id":0,"total_vram_bytes":18446744073709551616}]}`,
		`{"pool_id":"a","endpoint":"http://h:1","gpus":[{"id":1e3,"total_vram_bytes":-1}]}`,
		`{"pool_id":"a","endpoint":"http://h:1","gpus":[{"id":0,"total_vram_bytes":1,"free_vram_bytes":2}]}`,
		// Unicode and control characters, escaped and raw.
		`{"pool_id":"pööl","endpoint":"http://h:1"}`,
		`{"pool_id":"a","endpoint":"http://h:1","version":"0.4\u001b[31m red"}`,
		`{"pool_id":"a","endpoint":"http://h:1","version":"v\u0000"}`,
		`{"pool_id":"a","endpoint":"http://h:1","version":"v\u009b2J"}`,
		`{"pool_id":"a","endpoint":"http://h:1","version":"\ud800"}`,
		"{\"pool_id\":\"a\",\"endpoint\":\"http://h:1\",\"version\":\"\x1b[2J\"}",
		"{\"pool_id\":\"a\",\"endpoint\":\"http://h:1\",\"version\":\"\xff\xfe\"}",
		`{"pool_id":"a","endpoint":"http://h:1","gpus":[{"id":0,"kind":"cpu\r\n","name":"\u001b]0;title\u0007","uuid":"\u007f"}]}`,
		`{"pool_id":"a","endpoint":"http://h:1","gpus":[{"id":0,"workers":["w\u001b"]}]}`,
		`{"pool_id":"a\n","endpoint":"http://h:1"}`,
		`{"pool_id":"a","endpoint":"http://h\u001b:1"}`,
		`{"pool_id":"a","endpoint":"http://h\u009b:1"}`,
		`{"pool_id":"a","endpoint":"http://h:1/\u0085"}`,
		`{"pool_id":"a","node_id":"n\u2028","endpoint":"http://h:1"}`,
		// Bad endpoints.
		`{"pool_id":"a","endpoint":""}`, `{"pool_id":"a","endpoint":"ftp://h"}`, `{"pool_id":"a","endpoint":"http://"}`,
		`{"pool_id":"a","endpoint":"http://[::1"}`, `{"pool_id":"a","endpoint":"http://h:99999999999999999999"}`,
		`{"pool_id":"a","endpoint":"http://user:pass@h:1/p?q#f"}`,
		// Lengths at and over the limits.
		`{"pool_id":"` + strings.Repeat("a", 128) + `","endpoint":"http://h:1","version":"` + strings.Repeat("v", 128) + `"}`,
		`{"pool_id":"` + strings.Repeat("a", 129) + `","endpoint":"http://h:1"}`,
		`{"pool_id":"a","endpoint":"http://h:1","version":"` + strings.Repeat("v", 129) + `"}`,
		// Duplicate keys, wrong types, unknown fields, nested junk.
		`{"pool_id":"a","pool_id":"b","endpoint":"http://h:1","endpoint":"ftp://x"}`,
		`{"POOL_ID":"a","Endpoint":"http://h:1"}`,
		`{"pool_id":1,"endpoint":"http://h:1"}`, `{"pool_id":"a","endpoint":["http://h:1"]}`,
		`{"pool_id":"a","endpoint":"http://h:1","gpus":"x"}`, `{"pool_id":"a","endpoint":"http://h:1","gpus":[1]}`,
		`{"pool_id":"a","endpoint":"http://h:1","gpus":{"id":0}}`, `{"pool_id":"a","endpoint":"http://h:1","gpus":[{"id":"0"}]}`,
		`{"pool_id":"a","endpoint":"http://h:1","extra":true}`,
		`{"pool_id":"a","endpoint":"http://h:1","gpus":[{"id":0,"workers":[[[[{"a":[]}]]]]}]}`,
		`{"pool_id":null,"endpoint":null,"gpus":[null,{}]}`,
	} {
		f.Add([]byte(s))
	}
	for _, s := range junkSeeds {
		f.Add([]byte(s))
	}

	fq := newFuzzQueen(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		fq.next(t)
		status, answer := fq.send(t, "POST", "/v2/pools/register", body)
		if status != http.StatusOK {
			return
		}
		var reg api.Pool
		if err := decodeStrict(answer, &reg); err != nil {
			t.Fatalf("registration answer %s: %v", answer, err)
		}
		path := "/v2/pools/" + url.PathEscape(reg.PoolID)
		var back api.Pool
		fq.ok(t, "GET", path, nil, http.StatusOK, &back)
		if diff := cmp.Diff(reg, back); diff != "" {
			t.Fatalf("GET %s after registering %q (-registered +read back):\n%s", path, body, diff)
		}
		fq.shown(t, path, body)
		var list api.PoolList
		fq.ok(t, "GET", "/v2/pools", nil, http.StatusOK, &list)
		found := false
		for _, p := range list.Pools {
			found = found || p.PoolID == reg.PoolID
		}
		if !found {
			t.Fatalf("GET /v2/pools lacks the pool %s just registered", reg.PoolID)
		}
		fq.shown(t, "/v2/pools", body)
	})
}

// fuzzHeartbeat is a seed heartbeat with the queen tests' devices.
func fuzzHeartbeat(workers ...api.Worker) []byte {
	if workers == nil {
		workers = []api.Worker{}
	}
	return mustJSON(api.Heartbeat{GPUs: fuzzSeedGPUs, Workers: workers})
}

func FuzzHeartbeat(f *testing.F) {
	exited := fuzzSeedWorker("failed")
	code := 137
	exited.ExitCode = &code
	ready := fuzzSeedWorker("ready")
	readyAt := ready.StartedAt.Add(time.Second)
	ready.ReadyAt = &readyAt
	ready.History = []api.Transition{{From: "starting", To: "ready", Reason: "ready callback", At: readyAt, DurationMS: 1000}}
	other := fuzzSeedWorker("ready")
	other.WorkerID, other.LifecycleID = "w2", ""
	for _, body := range [][]byte{
		fuzzHeartbeat(),
		fuzzHeartbeat(fuzzSeedWorker("starting")),
		fuzzHeartbeat(ready),
		fuzzHeartbeat(fuzzSeedWorker("busy"), other),
		fuzzHeartbeat(fuzzSeedWorker("draining")),
		fuzzHeartbeat(exited),
		fuzzHeartbeat(ready, ready),
	} {
		f.Add(fuzzPool, body)
	}
	f.Add("nope", fuzzHeartbeat())
	for _, id := range []string{"", ".", "..", "../register", "a/b", "a b", "pööl", "a\x00", "a\x1b[31m", "%2F", "a?b=c", "a#b",
		strings.Repeat("p", 129), "\xff"} {
		f.Add(id, fuzzHeartbeat())
	}
	many := func(n int) []byte {
		ws := make([]api.Worker, n)
		for i := range ws {
			ws[i] = api.Worker{WorkerID: fmt.Sprintf("w%d", i), Status: "ready"}
		}
		return fuzzHeartbeat(ws...)
	}
	f.Add(fuzzPool, many(maxWorkers))
	f.Add(fuzzPool, many(maxWorkers+1))
	w := func(fields string) []byte {
		return []byte(`{"gpus":[],"workers":[{"worker_id":"fuzz-worker","lifecycle_id":"LIFECYCLE_ID","model_ref":"tiny","status":"ready"` + fields + `}]}`)
	}
	for _, body := range [][]byte{
		// Huge, negative and mistyped numbers.
		w(`,"pid":9223372036854775807,"exit_code":-9223372036854775808,"gpu_device":2147483648,"vram_bytes":18446744073709551615,"in_flight":-1`),
		w(`,"pid":-1,"gpu_device":-1`), w(`,"pid":2147483648`), w(`,"exit_code":4294967296`),
		w(`,"vram_bytes":-1`), w(`,"pid":1.5`), w(`,"pid":"100"`), w(`,"pid":1e19`),
		// Times at and past the edges of what JSON can say.
		w(`,"started_at":"0000-01-01T00:00:00Z","ready_at":"9999-12-31T23:59:59.999999999Z","stopped_at":"0001-01-01T00:00:00Z"`),
		w(`,"started_at":"0000-01-01T00:00:00+23:59"`), w(`,"started_at":"2026-13-45T99:99:99Z"`),
		w(`,"started_at":"now"`), w(`,"ready_at":null,"stopped_at":null,"exit_code":null`),
		// Control characters and unicode in every string the queen keeps.
		w(`,"uri":"http://127.0.0.1:8001/\u001b[2J"`), w(`,"reason":"oom\u001b[31m killed\u0007"`),
		w(`,"reason":"line one\nline two"`), w(`,"reason":"\u009b31m"`), w(`,"reason":"ünïcödé ✓ 🐝"`),
		w(`,"history":[{"from":"starting\u0000","to":"ready\r","reason":"\u001b]8;;http://x\u0007link\u001b]8;;\u0007","at":"2026-01-02T03:04:05Z","duration_ms":-1}]`),
		w(`,"model_ref":"../../etc/passwd"`), w(`,"model_ref":"tiny\u001b"`), w(`,"status":"READY"`), w(`,"status":""`),
		[]byte(`{"gpus":[{"id":0,"kind":"cuda\u001b","name":"\u0000","uuid":"GPU-\u007f","workers":["\u001b"]}],"workers":[]}`),
		[]byte(`{"gpus":[{"id":-1}],"workers":[]}`),
		[]byte(`{"gpus":[{"id":0,"total_vram_bytes":1,"free_vram_bytes":2}],"workers":[]}`),
		[]byte(`{"gpus":[],"workers":[{"worker_id":"w\u001b","status":"ready"}]}`),
		[]byte(`{"gpus":[],"workers":[{"worker_id":"w1","lifecycle_id":"wk-\u001b","status":"ready"}]}`),
		// Duplicate keys, wrong types, nested junk.
		[]byte(`{"workers":[],"workers":[{"worker_id":"w1","status":"ready","status":"bogus"}]}`),
		[]byte(`{"gpus":{},"workers":[]}`), []byte(`{"gpus":[],"workers":{"worker_id":"w1"}}`),
		[]byte(`{"gpus":[],"workers":[null]}`), []byte(`{"gpus":[],"workers":[[]]}`), []byte(`{"gpus":[],"workers":[{"history":[[[]]]}]}`),
		[]byte(`{"gpus":[],"workers":[],"extra":{"a":[1,{"b":null}]}}`),
		// The workers' own tokens.
		[]byte(`{"gpus":[],"workers":[{"worker_id":"fuzz-worker","lifecycle_id":"LIFECYCLE_ID","status":"ready"}],"worker_tokens":{"fuzz-worker":"0123456789abcdef0123456789abcdef"}}`),
		[]byte(`{"gpus":[],"workers":[],"worker_tokens":{"w1":"0123456789abcdef0123456789abcdef"}}`),
		[]byte(`{"gpus":[],"workers":[{"worker_id":"w1","status":"ready"}],"worker_tokens":{"w1":"tok\u001b en"}}`),
	} {
		f.Add(fuzzPool, body)
	}
	for _, s := range junkSeeds {
		f.Add(fuzzPool, []byte(s))
	}

	fq := newFuzzQueen(f)
	f.Fuzz(func(t *testing.T, id string, body []byte) {
		fq.next(t)
		lid := fq.prepare(t)
		body = bytes.ReplaceAll(body, []byte(fuzzLifecycle), []byte(lid))
		target := "/v2/pools/" + url.PathEscape(id) + "/heartbeat"
		status, answer := fq.send(t, "POST", target, body)
		if status != http.StatusOK {
			return
		}
		var ack api.HeartbeatAnswer
		if err := decodeStrict(answer, &ack); err != nil || ack.PoolID != id {
			t.Fatalf("heartbeat answer %s for pool %q: %v", answer, id, err)
		}
		fq.shown(t, "/v2/pools/"+url.PathEscape(id), body)
		fq.shown(t, "/api/admin/workers?limit=3&pool_id="+url.QueryEscape(id), body)
	})
}

func FuzzWorkerEvent(f *testing.F) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ev := func(from, to, reason string) []byte {
		w := fuzzSeedWorker(to)
		if to == "failed" || to == "stopped" {
			code := 0
			w.ExitCode = &code
		}
		return mustJSON(api.WorkerEvent{PoolID: fuzzPool, WorkerID: fuzzWorker, LifecycleID: fuzzLifecycle, From: from, To: to,
			Reason: reason, At: at, Worker: w})
	}
	// The life of TestEventsDriveTheRow, one event a seed.
	for _, e := range [][3]string{
		{"", "starting", "spawned"}, {"starting", "ready", "ready callback"}, {"ready", "busy", "request"},
		{"busy", "ready", "idle"}, {"ready", "degraded", "missed health check"}, {"degraded", "ready", "recovered"},
		{"busy", "draining", "drain requested"}, {"draining", "stopped", "exit code 0"}, {"starting", "failed", "killed by signal 9"},
		{"draining", "stopped", "?"}, {"", "ready", ""}, {"ready", "bogus", "x"}, {"bogus", "ready", "x"},
		{"ready", "ready", strings.Repeat("r", 4*maxReasonLen)}, {"ready", "ready", strings.Repeat("r", 4*maxReasonLen+1)},
		{"ready", "busy", "\u001b[31mred\u001b[0m"}, {"ready", "busy", "line one\nline two"}, {"ready", "busy", "\u009b2J"},
		{"ready", "failed", "\x00"}, {"ready", "busy", "ünïcödé ✓ 🐝"}, {"ready", "failed", "\xff\xfe"},
	} {
		f.Add(ev(e[0], e[1], e[2]))
	}
	noLifecycle := api.WorkerEvent{PoolID: fuzzPool, WorkerID: fuzzWorker, To: "ready", Reason: "r", At: at, Worker: api.Worker{WorkerID: fuzzWorker}}
	f.Add(mustJSON(noLifecycle))
	e := func(fields string) []byte {
		return []byte(`{"pool_id":"fuzz-pool","worker_id":"fuzz-worker","lifecycle_id":"LIFECYCLE_ID","from":"starting","to":"ready","reason":"r"` + fields + `}`)
	}
	for _, body := range [][]byte{
		e(`,"worker":{"worker_id":"other"}`), e(`,"pool_id":"nope"`), e(`,"pool_id":""`), e(`,"worker_id":"w\u001b"`),
		e(`,"lifecycle_id":"wk-0000000000000000"`), e(`,"lifecycle_id":"not a lifecycle id"`), e(`,"lifecycle_id":""`),
		e(`,"at":"0000-01-01T00:00:00Z"`), e(`,"at":"9999-12-31T23:59:59.999999999-23:59"`), e(`,"at":"yesterday"`), e(`,"at":null`),
		// The worker's own facts: numbers, times, strings.
		e(`,"worker":{"pid":9223372036854775807,"exit_code":-9223372036854775808,"gpu_device":2147483648,"vram_bytes":18446744073709551615}`),
		e(`,"worker":{"pid":-1,"gpu_device":-1,"in_flight":-5}`), e(`,"worker":{"pid":2147483648}`),
		e(`,"worker":{"started_at":"0000-01-01T00:00:00Z","ready_at":"9999-12-31T23:59:59Z","stopped_at":"0001-01-01T00:00:00Z"}`),
		e(`,"worker":{"uri":"http://127.0.0.1:8001/\u001b[2J","reason":"\u001b[31m","model_ref":"tiny\u0007"}`),
		e(`,"worker":{"lifecycle_id":"wk-\u001b","status":"\u0000"}`), e(`,"worker":{"model_ref":"../../etc/passwd"}`),
		e(`,"worker":{"history":[{"from":"\u001b","to":"\r","reason":"\u0085","at":"2026-01-02T03:04:05Z"}]}`),
		// Duplicate keys, wrong types, nested junk.
		e(`,"to":"bogus","to":"ready"`), e(`,"reason":1`), e(`,"worker":[]`), e(`,"worker":null`), e(`,"worker":{"worker_id":1}`),
		e(`,"worker":{"history":[[[{"a":[]}]]]}`), e(`,"extra":{}`),
		e(`,"worker_token":"0123456789abcdef0123456789abcdef"`), e(`,"worker_token":"\u0000"`), e(`,"worker_token":""`),
	} {
		f.Add(body)
	}
	for _, s := range junkSeeds {
		f.Add([]byte(s))
	}

	fq := newFuzzQueen(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		fq.next(t)
		lid := fq.prepare(t)
		body = bytes.ReplaceAll(body, []byte(fuzzLifecycle), []byte(lid))
		status, answer := fq.send(t, "POST", "/v2/internal/workers/events", body)
		if status != http.StatusOK {
			return
		}
		var ack api.EventAck
		if err := decodeStrict(answer, &ack); err != nil {
			t.Fatalf("event answer %s: %v", answer, err)
		}
		fq.shown(t, "/v2/pools/"+fuzzPool, body)
		fq.shown(t, "/api/admin/workers?limit=3&pool_id="+fuzzPool, body)
	})
}
