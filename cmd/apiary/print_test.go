package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/queen"
	"github.com/apiary-llm/apiary/internal/secret"
)

// hostile is what a hive (or anything that answers as a queen) may put in
// a name or a reason: a window-title rewrite, a screen clear, a C1 CSI and
// a right-to-left override.
const hostile = "\x1b]0;pwned\x07 \x1b[2J \u009b31m \u202eevil"

// assertPrintable fails if s holds anything a terminal acts on: a control
// character other than the newline, DEL, a C1 code or a bidirectional
// control.
func assertPrintable(t *testing.T, what, s string) {
	t.Helper()
	for _, r := range s {
		if (r < 0x20 && r != '\n') || (r >= 0x7f && r <= 0x9f) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) {
			t.Errorf("%s holds %U:\n%q", what, r, s)
			return
		}
	}
}

// fakeQueen answers every admin call with hostile text in every string
// field, as a queen that passes on what hives report would.
func fakeQueen(t *testing.T) string {
	t.Helper()
	row := api.LifecycleRow{ID: "wk-" + hostile, PoolID: hostile, ModelRef: hostile, Status: hostile,
		Reason: hostile, Owner: hostile, CreatedAt: time.Now()}
	pool := api.Pool{PoolID: hostile, Endpoint: hostile, NodeID: hostile, Version: hostile, Status: hostile}
	mux := http.NewServeMux()
	reply := func(path string, v any) {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) { api.WriteJSON(w, http.StatusOK, v) })
	}
	reply("GET /api/admin/workers", api.LifecycleRowList{Workers: []api.LifecycleRow{row}})
	reply("GET /v2/pools", api.PoolList{Pools: []api.Pool{pool}})
	reply("GET /api/admin/audit", api.AuditList{Entries: []api.AuditEntry{{TS: time.Now(), Actor: hostile, Action: hostile, Target: hostile, Reason: hostile}}})
	reply("GET /api/admin/nodes", api.NodeList{Nodes: []api.Node{{Name: hostile, SSH: hostile, InstallDir: hostile,
		Hive: api.NodeHive{State: hostile, Message: hostile, NodeAddr: hostile}}}})
	reply("DELETE /api/admin/nodes/{name}", api.Node{Name: hostile, Hive: api.NodeHive{State: hostile}})
	reply("POST /v2/pools/{id}/drain", pool)
	mux.HandleFunc("POST /api/admin/workers", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Action string }
		_ = json.NewDecoder(r.Body).Decode(&req)
		if req.Action == "start" {
			api.WriteJSON(w, http.StatusCreated, api.AdminWorkerResponse{LifecycleID: "wk-" + hostile, Worker: row})
			return
		}
		var e api.Error
		e.Error.Code, e.Error.Message = "worker_not_found", "no worker "+hostile+"\nsecond line"
		api.WriteJSON(w, http.StatusNotFound, e)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// Regression: names and reasons from daemons reached the CLI's
// tables and messages with their escape bytes intact. Every one now shows
// as visible escapes.
func TestDaemonTextIsEscapedInTablesAndMessages(t *testing.T) {
	q := "--queen=" + fakeQueen(t)
	for _, args := range [][]string{
		{"workers", "ls", q},
		{"pools", "ls", q},
		{"audit", q},
		{"nodes", "ls", q},
		{"nodes", "rm", "n1", q},
		{"pools", "drain", "p1", "--reason", "r", q},
		{"workers", "start", "--model", "tiny", "--reason", "r", q},
		{"workers", "stop", "wk-0000000000000001", "--reason", "r", q},
	} {
		_, out, errOut := apiary(t, args...)
		all := out + errOut
		assertPrintable(t, fmt.Sprintf("apiary %v output", args), all)
		for _, want := range []string{`\x1b]0;pwned\x07`, `\x1b[2J`, `\u009b31m`, `\u202eevil`} {
			if !strings.Contains(all, want) {
				t.Errorf("apiary %v: output lacks %s:\n%s", args, want, all)
			}
		}
	}
	// An error's own lines stay lines; nothing else breaks them.
	_, _, errOut := apiary(t, "workers", "stop", "wk-0000000000000001", "--reason", "r", q)
	if !strings.Contains(errOut, "\nsecond line") {
		t.Errorf("error lost its line break: %q", errOut)
	}
	// A cell's tab or newline cannot shift columns or forge a row.
	var b bytes.Buffer
	if err := printAudit(&b, []api.AuditEntry{{Actor: "a\tb\nFORGED", Action: "x"}}); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(b.String()), "\n"); len(lines) != 2 || !strings.Contains(lines[1], `a\tb\nFORGED`) {
		t.Errorf("audit table with a tab and a newline in a cell:\n%s", b.String())
	}
}

// The same attack through the real queen: a hive with the cluster token
// reports a worker's failure with a hostile reason; `apiary workers ls`, `apiary audit` and `apiary pools ls` show
// them as printable text, whether the queen cleaned them or the CLI.
func TestHiveReasonReachesCLIPrintable(t *testing.T) {
	const admin, cluster = "admin-token-0123456789", "cluster-token-0123456789"
	t.Setenv("APIARY_ADMIN_TOKEN", admin)
	t.Setenv("APIARY_CLUSTER_TOKEN", cluster)
	hive := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/workers/start" {
			api.WriteJSON(w, http.StatusAccepted, api.StartWorkerResponse{WorkerID: "w1", Status: "starting"})
			return
		}
		api.WriteJSON(w, http.StatusAccepted, struct{}{})
	}))
	t.Cleanup(hive.Close)
	qn, err := queen.New(queen.Config{Addr: "127.0.0.1:0", DataDir: t.TempDir(),
		Tokens: secret.Tokens{API: "api-token-0123456789", Admin: admin, Cluster: cluster},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- qn.Run(context.Background()) }()
	<-qn.Ready()
	t.Cleanup(func() {
		qn.Close()
		if err := <-errc; err != nil {
			t.Error(err)
		}
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	})
	post := func(path string, body any) {
		t.Helper()
		data, _ := json.Marshal(body)
		req, _ := http.NewRequest(http.MethodPost, qn.URL()+path, bytes.NewReader(data))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+cluster)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST %s: %s %s", path, resp.Status, msg)
		}
	}
	post("/v2/pools/register", api.RegisterPool{PoolID: "p1", Endpoint: hive.URL, NodeID: "n1", Version: "v1",
		GPUs: []api.GPU{{ID: 0, Kind: "cpu", TotalBytes: 8 << 30, FreeBytes: 6 << 30}}})
	q := "--queen=" + qn.URL()
	code, out, errOut := apiary(t, "workers", "start", "--model", "tiny", "--pool", "p1", "--reason", "operator", q)
	if code != 0 {
		t.Fatalf("workers start: exit %d\n%s", code, errOut)
	}
	lid := strings.TrimSpace(out)
	post("/v2/internal/workers/events", api.WorkerEvent{PoolID: "p1", WorkerID: "w1", LifecycleID: lid,
		From: "starting", To: "failed", Reason: "crashed: " + hostile, At: time.Now()})
	for _, args := range [][]string{{"workers", "ls", q}, {"audit", q}, {"pools", "ls", q}} {
		code, out, errOut := apiary(t, args...)
		if code != 0 {
			t.Errorf("apiary %v: exit %d\n%s", args, code, errOut)
		}
		assertPrintable(t, fmt.Sprintf("apiary %v output", args), out+errOut)
		if args[0] != "pools" && !strings.Contains(out, "pwned") {
			t.Errorf("apiary %v: the reason is not shown:\n%s", args, out)
		}
	}
}

// `apiary infer` prints the model's answer as it streams: newlines and
// tabs stay, no other control byte reaches the terminal.
func TestInferAnswerKeepsOnlyNewlinesAndTabs(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		api.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok", "version": "test"})
	})
	mux.HandleFunc("GET /api/admin/workers", func(w http.ResponseWriter, r *http.Request) {
		api.WriteJSON(w, http.StatusOK, api.LifecycleRowList{})
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, piece := range []string{"Hello\n", "\tworld ", hostile, " end\r\n"} {
			chunk, _ := json.Marshal(map[string]any{"choices": []map[string]any{{"index": 0, "delta": map[string]string{"content": piece}}}})
			fmt.Fprintf(w, "data: %s\n\n", chunk)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	code, out, errOut := apiary(t, "infer", "--queen", srv.URL, "--model", "tiny", "--prompt", "hi")
	if code != 0 {
		t.Fatalf("infer: exit %d\n%s", code, errOut)
	}
	if want := "Hello\n\tworld ]0;pwned [2J 31m evil end\n"; out != want {
		t.Errorf("infer printed %q, want %q", out, want)
	}
}

// `pools ls` counts the devices no worker can use.
func TestPoolsTableCountsUnusableDevices(t *testing.T) {
	var b strings.Builder
	pools := []api.Pool{{PoolID: "gpu-node", Status: "healthy", GPUs: []api.GPU{{ID: 0, Unusable: "no usable GPU backend"}, {ID: 1}}}}
	if err := printPools(&b, pools, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "2 (1 unusable)") {
		t.Errorf("table:\n%s", b.String())
	}
}

// `pools ls` shows what is loaded with its last use, the latest eviction
// and the hive's --max-loaded.
func TestPoolsTableShowsLoadedAndEvictions(t *testing.T) {
	var b strings.Builder
	now := time.Now()
	used, stopped := now.Add(-3*time.Second), now
	pools := []api.Pool{{PoolID: "box", Status: "healthy", MaxLoaded: 1,
		Workers:   []api.Worker{{ModelRef: "b", LastUsedAt: &used}, {ModelRef: "tiny", StoppedAt: &stopped}},
		Evictions: []api.Eviction{{Model: "tiny", For: "b", At: now.Add(-2 * time.Minute)}, {Model: "b", For: "tiny", At: now.Add(-time.Hour)}}}}
	if err := printPools(&b, pools, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2 (max 1)", "b 3s ago", "tiny for b 2m ago"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %q in the table:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "tiny unused") {
		t.Errorf("a stopped worker is shown loaded:\n%s", b.String())
	}
}

// `workers ls` shows a worker's model by the name clients send (its
// --config name) with the file that serves it; a model the config does
// not name by its file.
func TestWorkersTableShowsTheConfiguredName(t *testing.T) {
	var b strings.Builder
	rows := []api.LifecycleRow{{ID: "wk-1", ModelRef: "qwen2.5-0.5b-instruct-q4_k_m", ModelName: "qwen", Status: "RUNNING"},
		{ID: "wk-2", ModelRef: "tiny", Status: "RUNNING"}}
	if err := printWorkers(&b, nil, rows, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "qwen (qwen2.5-0.5b-instruct-q4_k_m)") || !strings.Contains(b.String(), "tiny") {
		t.Errorf("table:\n%s", b.String())
	}
}

// A worker that is a Kubernetes Pod shows its Pod and its node; a table
// without one has no POD column.
func TestWorkersTableShowsPodsAndNodes(t *testing.T) {
	dev := 3
	var b strings.Builder
	rows := []api.LifecycleRow{{ID: "wk-1", ModelRef: "tiny", Status: "RUNNING", GPUDevice: &dev, DeviceKind: api.DeviceCPU,
		Pod: "apiary/apiary-worker-1", Node: "node-2"}, {ID: "wk-2", ModelRef: "tiny", Status: "STARTING"}}
	if err := printWorkers(&b, nil, rows, time.Now()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	if !strings.Contains(lines[0], "POD") || !strings.Contains(lines[1], "cpu on node-2") || !strings.Contains(lines[1], "apiary/apiary-worker-1") {
		t.Errorf("table:\n%s", b.String())
	}
	b.Reset()
	if err := printWorkers(&b, nil, rows[1:], time.Now()); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "POD") {
		t.Errorf("a table without pods has a POD column:\n%s", b.String())
	}
}

// `jobs submit` without --endpoint takes the first line's url.
func TestJobsSubmitTakesTheFirstLinesURL(t *testing.T) {
	for in, want := range map[string]string{
		"\n{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/embeddings\",\"body\":{}}\n{\"url\":\"/v1/completions\"}\n": "/v1/embeddings",
		"{\"custom_id\":\"a\"}\n": "",
		"not json\n":              "",
		"":                        "",
	} {
		if got := firstURL([]byte(in)); got != want {
			t.Errorf("firstURL(%q) = %q, want %q", in, got, want)
		}
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(file, []byte("{\"custom_id\":\"a\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := apiary(t, "jobs", "submit", file, "--queen=http://127.0.0.1:1"); code != 2 || !strings.Contains(errOut, "names no url; give --endpoint") {
		t.Errorf("submit of a file without url: exit %d, %q", code, errOut)
	}
}
