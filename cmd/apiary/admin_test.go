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
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/queen"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// startTestQueen runs a queen in this process (SQLite in a temp dir) and
// registers one pool whose hive does not answer.
func startTestQueen(t *testing.T) string {
	t.Helper()
	url := runTestQueen(t)
	// Neither hive answers (ports 1 and 2 of loopback; one endpoint a
	// pool): a start on p2 fails and makes it unhealthy; p1 stays
	// healthy for the pool commands.
	for i, id := range []string{"p1", "p2"} {
		registerTestPool(t, url, id, fmt.Sprintf("http://127.0.0.1:%d", i+1))
	}
	return url
}

// runTestQueen runs a queen in this process (SQLite in a temp dir) until
// the test ends, and returns its URL.
func runTestQueen(t *testing.T) string {
	t.Helper()
	q, err := queen.New(queen.Config{Addr: "127.0.0.1:0", DataDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- q.Run(context.Background()) }()
	<-q.Ready()
	t.Cleanup(func() {
		q.Close()
		if err := <-errc; err != nil {
			t.Error(err)
		}
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	})
	return q.URL()
}

// registerTestPool registers pool id, whose hive is at endpoint, with the
// queen at url: one CPU with 6 GiB free.
func registerTestPool(t *testing.T, url, id, endpoint string) {
	t.Helper()
	body, _ := json.Marshal(api.RegisterPool{PoolID: id, Endpoint: endpoint, NodeID: "n1", Version: "t",
		GPUs: []api.GPU{{ID: 0, Kind: "cpu", TotalBytes: 8 << 30, FreeBytes: 6 << 30}}})
	resp, err := http.Post(url+"/v2/pools/register", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("register %s: %s", id, resp.Status)
	}
}

// apiary runs the CLI and returns its exit code, stdout and stderr.
func apiary(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(t.Context(), args, &out, &errb)
	code := exitCode(err, &errb)
	if code != 0 {
		if p := errorStyleProblems(errb.String()); len(p) > 0 {
			t.Errorf("apiary %s: the error shows %s (say what was wrong and what to do, in words):\n%s", strings.Join(args, " "), strings.Join(p, ", "), errb.String())
		}
	}
	return code, out.String(), errb.String()
}

func TestAdminCommands(t *testing.T) {
	url := startTestQueen(t)
	q := "--queen=" + url
	for _, tc := range []struct {
		args   []string
		code   int
		stdout []string // substrings of stdout
		stderr []string // substrings of stderr
	}{
		{[]string{"pools", "ls", q}, 0, []string{"POOL", "p1", "healthy", "6.0 GiB"}, nil},
		{[]string{"workers", "start", "--model", "tiny", "--pool", "p2", q}, 2, nil, []string{"--reason is required"}},
		{[]string{"workers", "start", "--reason", "x", q}, 2, nil, []string{"--model is required"}},
		{[]string{"workers", "start", "--model", "tiny", "--pool", "p2", "--reason", "cli test", q}, 1, nil, []string{"hive_unreachable", "is FAILED", "did not answer (marked unhealthy)"}},
		{[]string{"workers", "ls", q}, 0, []string{"STATUS", "FAILED", "tiny", "p2", "operator"}, nil},
		{[]string{"workers", "ls", "--status", "RUNNING", q}, 0, []string{"ID"}, nil},
		{[]string{"workers", "create", "--model", "tiny", "--placement", "operator", "--reason", "run by hand", q}, 0, []string{"wk-"}, []string{"STARTING on pool manual"}},
		{[]string{"workers", "create", "--model", "tiny", "--placement", "operator", "--pool", "p1", "--reason", "x", q}, 2, nil, []string{"--pool belongs to --placement auto"}},
		{[]string{"workers", "create", "--model", "tiny", "--placement", "elsewhere", "--reason", "x", q}, 2, nil, []string{"--placement must be"}},
		{[]string{"workers", "create", "--model", "tiny", "--pool", "p2", "--reason", "auto", q}, 1, nil, []string{"pool_unavailable", "pool p2 is unhealthy"}},
		{[]string{"workers", "ls", "--pool", "manual", q}, 0, []string{"STARTING", "tiny", "manual", "operator"}, nil},
		{[]string{"workers", "stop", "wk-0000000000000000", "--reason", "x", q}, 1, nil, []string{"worker_not_found"}},
		{[]string{"workers", "stop", "--reason", "x", q}, 2, nil, []string{"accepts 1 arg"}},
		{[]string{"workers", q}, 2, nil, []string{"missing command"}},
		{[]string{"pools", "undrain", "p1", "--reason", "not drained", q}, 0, []string{"p1: healthy"}, nil},
		{[]string{"pools", "drain", "p1", "--reason", "maintenance", q}, 0, []string{"p1: draining"}, nil},
		{[]string{"pools", "undrain", "p1", q}, 2, nil, []string{"--reason is required"}},
		{[]string{"pools", "undrain", "p1", "--reason", "maintenance done", q}, 0, []string{"p1: healthy"}, nil},
		{[]string{"audit", "--limit", "1", q}, 0, []string{"pool.undrain", "maintenance done"}, nil},
		{[]string{"pools", "drain", "p1", "--reason", "maintenance", q}, 0, []string{"p1: draining"}, nil},
		{[]string{"pools", "rm", "p1", q}, 2, nil, []string{"pools rm: --reason is required"}},
		{[]string{"pools", "drain", "p1", q}, 2, nil, []string{"pools drain: --reason is required"}},
		{[]string{"pools", "rm", "p1", "--reason", "retired", q}, 0, []string{"p1: offline"}, nil},
		{[]string{"pools", "drain", "nope", "--reason", "x", q}, 1, nil, []string{"pool_not_found"}},
		{[]string{"audit", "--limit", "3", q}, 0, []string{"ACTION", "pool.offline", "pool.drain", "maintenance"}, nil},
		{[]string{"audit", "--since", "yesterday", q}, 2, nil, []string{"--since"}},
		{[]string{"audit", "--until", "soon", q}, 2, nil, []string{"--until"}},
		{[]string{"audit", "--action", "pool.undrain", "--target", "p1", "--until", "1ms", q}, 0, []string{"pool.undrain", "maintenance done"}, nil},
		{[]string{"pools", "ls", "--queen=http://127.0.0.1:1"}, 1, nil, []string{"queen unreachable", "apiary queen"}},
		{[]string{"pools", "ls", "--queen=http://127.0.0.1:1/?x"}, 2, nil, []string{"--queen", "query"}},
		{[]string{"workers", "ls", "--queen=http://admin:pw@127.0.0.1:1"}, 2, nil, []string{"user info"}},
		{[]string{"audit", q, "--ca-file=/nonexistent/ca.pem"}, 2, nil, []string{"APIARY_CA_FILE", "/nonexistent/ca.pem"}},
	} {
		code, out, errOut := apiary(t, tc.args...)
		if code != tc.code {
			t.Errorf("apiary %v: exit %d, want %d\nstdout: %s\nstderr: %s", tc.args, code, tc.code, out, errOut)
			continue
		}
		for _, s := range tc.stdout {
			if !strings.Contains(out, s) {
				t.Errorf("apiary %v: stdout lacks %q:\n%s", tc.args, s, out)
			}
		}
		for _, s := range tc.stderr {
			if !strings.Contains(errOut, s) {
				t.Errorf("apiary %v: stderr lacks %q:\n%s", tc.args, s, errOut)
			}
		}
	}
}

func TestAdminCommandsJSON(t *testing.T) {
	url := startTestQueen(t)
	q := "--queen=" + url
	_, out, _ := apiary(t, "pools", "ls", "--json", q)
	var pools api.PoolList
	if err := json.Unmarshal([]byte(out), &pools); err != nil || len(pools.Pools) != 2 || pools.Pools[0].PoolID != "p1" {
		t.Errorf("pools ls --json: %v %s", err, out)
	}
	apiary(t, "workers", "start", "--model", "tiny", "--pool", "p1", "--reason", "json", q)
	_, out, _ = apiary(t, "workers", "ls", "--json", q)
	var rows api.LifecycleRowList
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows.Workers) != 1 || rows.Workers[0].Status != "FAILED" {
		t.Errorf("workers ls --json: %v %s", err, out)
	}
	_, out, _ = apiary(t, "audit", "--json", q)
	var audit api.AuditList
	if err := json.Unmarshal([]byte(out), &audit); err != nil || !slices.ContainsFunc(audit.Entries, func(e api.AuditEntry) bool { return e.Action == "pool.unhealthy" }) ||
		!slices.ContainsFunc(audit.Entries, func(e api.AuditEntry) bool { return e.Action == "worker.start" }) {
		t.Errorf("audit --json: %v %s; want the start and the pool marked unhealthy", err, out)
	}
}

func TestQueenRefusesNonLoopbackWithoutTokens(t *testing.T) {
	for _, env := range []string{"APIARY_API_TOKEN", "APIARY_ADMIN_TOKEN", "APIARY_CLUSTER_TOKEN"} {
		t.Setenv(env, "")
	}
	code, _, errOut := apiary(t, "queen", "--addr", "0.0.0.0:0", "--data-dir", t.TempDir())
	if code != 2 || !strings.Contains(errOut, "not a loopback address") || !strings.Contains(errOut, "APIARY_ADMIN_TOKEN") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
}

func TestModelsScaleCommand(t *testing.T) {
	url := startTestQueen(t)
	q := "--queen=" + url
	for _, tc := range []struct {
		args   []string
		code   int
		stdout []string
		stderr []string
	}{
		{[]string{"models", "scale", q}, 0, []string{"MODEL", "MIN", "STATE"}, nil},
		{[]string{"models", "scale", "tiny", "--reason", "x", q}, 2, nil, []string{"--min is required"}},
		{[]string{"models", "scale", "tiny", "--min", "1", q}, 2, nil, []string{"--reason is required"}},
		{[]string{"models", "scale", "tiny", "--min", "2", "--max", "1", "--reason", "x", q}, 2, nil, []string{"--max 1 is below --min 2"}},
		{[]string{"models", "scale", "--min", "1", "--reason", "x", q}, 2, nil, []string{"need a MODEL"}},
		{[]string{"models", "scale", "tiny", "--min", "1001", "--reason", "x", q}, 1, nil, []string{"min_workers 1001 must be from 0 to 1000"}},
		{[]string{"models", "scale", "bad/model", "--min", "1", "--reason", "x", q}, 1, nil, []string{"not a model ref"}},
		{[]string{"models", "scale", "tiny", "--min", "0", "--max", "2", "--reason", "at most two", q}, 0, []string{"tiny", "0", "2", "at most two"}, nil},
		{[]string{"models", "scale", q}, 0, []string{"tiny", "at most two", "ok"}, nil},
		{[]string{"audit", "--limit", "1", q}, 0, []string{"model.scale", "model:tiny", "at most two"}, nil},
	} {
		code, out, errOut := apiary(t, tc.args...)
		if code != tc.code {
			t.Errorf("apiary %v: exit %d, want %d\nstdout: %s\nstderr: %s", tc.args, code, tc.code, out, errOut)
			continue
		}
		for _, s := range tc.stdout {
			if !strings.Contains(out, s) {
				t.Errorf("apiary %v: stdout lacks %q:\n%s", tc.args, s, out)
			}
		}
		for _, s := range tc.stderr {
			if !strings.Contains(errOut, s) {
				t.Errorf("apiary %v: stderr lacks %q:\n%s", tc.args, s, errOut)
			}
		}
	}
	_, out, _ := apiary(t, "models", "scale", "--json", q)
	var list api.ModelSettingList
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Models) != 1 || list.Models[0].MaxWorkers == nil || *list.Models[0].MaxWorkers != 2 {
		t.Errorf("models scale --json: %v %s", err, out)
	}
}

// A start of a model no pool has is a model not found (404), named, not
// a pool unavailable: the hives answered their model lists.
func TestStartOfAModelNoPoolHasIsNotFound(t *testing.T) {
	hive := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/models" {
			api.WriteJSON(w, http.StatusOK, api.ModelList{Models: []api.Model{{Ref: "tiny", SizeBytes: 1 << 20}}})
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(hive.Close)
	url := runTestQueen(t)
	registerTestPool(t, url, "p1", hive.URL)
	code, _, errOut := apiary(t, "workers", "start", "--model", "nosuch", "--reason", "x", "--queen="+url)
	if code != 1 || !strings.Contains(errOut, "model_not_found") || !strings.Contains(errOut, "no pool has model nosuch") {
		t.Errorf("start of a model no pool has: exit %d, %q", code, errOut)
	}
}
