//go:build !race

package queen

// Workers run by hand: rows created with placement operator, claimed by
// `apiary worker --queen URL --lifecycle-id ID` (or a row of the worker's
// own without one), served through the queen, health-checked, stopped,
// and rows no worker claims.

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/rpc"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
	"github.com/apiary-llm/apiary/internal/transport"
)

// The tokens of the claim tests' queen and workers.
const (
	claimAPIToken     = "api-0123456789abcdef"
	claimAdminToken   = "admin-0123456789abcdef"
	claimClusterToken = "cluster-0123456789abcdef"
	claimWorkerToken  = "worker-0123456789abcdef"
)

// handRunQueen is a queen with tokens and no hive, run as a process.
type handRunQueen struct {
	*proc
	url   string
	admin *keeper.Client
	oai   oai.Client
	dir   string
}

func startHandRunQueen(t *testing.T, dir string, extra ...string) *handRunQueen {
	t.Helper()
	env := []string{"APIARY_API_TOKEN=" + claimAPIToken, "APIARY_ADMIN_TOKEN=" + claimAdminToken, "APIARY_CLUSTER_TOKEN=" + claimClusterToken}
	args := append([]string{"queen", "--addr", "127.0.0.1:0", "--data-dir", dir, "--flush-interval", "100ms"}, extra...)
	p := startProc(t, "queen", env, args...)
	rec, _ := p.logs.wait(t, 0, "queen serving", nil)
	url := "http://" + rec.Attrs["addr"]
	q := &handRunQueen{proc: p, url: url, dir: dir, admin: keeper.NewClient(url, claimAdminToken, claimClusterToken),
		oai: oai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey(claimAPIToken), option.WithMaxRetries(0))}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("queen logs:\n%s", p.logs.String())
		}
	})
	return q
}

// tinyModelFile writes the test model into a new directory and returns its
// path.
func tinyModelFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := testmodel.WriteFile(path, testmodel.Options{}); err != nil {
		t.Fatal(err)
	}
	return path
}

// startHandRunWorker runs `apiary worker` on the test model with the
// worker and cluster tokens and the extra flags (--queen, --lifecycle-id).
func startHandRunWorker(t *testing.T, name string, extra ...string) *proc {
	t.Helper()
	env := []string{"APIARY_WORKER_TOKEN=" + claimWorkerToken, "APIARY_CLUSTER_TOKEN=" + claimClusterToken}
	args := append([]string{"worker", "--model", tinyModelFile(t), "--port", "0", "--threads", "1", "--shutdown-grace", "2s"}, extra...)
	w := startProc(t, name, env, args...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s logs:\n%s", name, w.logs.String())
		}
	})
	return w
}

// complete runs one completion through the queen and returns the
// lifecycle id of the worker that served it.
func (q *handRunQueen) complete(t *testing.T) string {
	t.Helper()
	var resp *http.Response
	out, err := q.oai.Completions.New(t.Context(), completion(4), option.WithResponseInto(&resp))
	if err != nil {
		t.Fatalf("completion through the queen: %v", err)
	}
	if len(out.Choices) != 1 || out.Usage.CompletionTokens == 0 {
		t.Fatalf("completion: %+v", out)
	}
	return resp.Header.Get(api.WorkerHeader)
}

func (q *handRunQueen) row(t *testing.T, id string) api.LifecycleRow {
	t.Helper()
	rows, err := q.admin.Workers(t.Context(), keeper.WorkerFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.ID == id {
			return r
		}
	}
	t.Fatalf("no row %s in %+v", id, rows)
	return api.LifecycleRow{}
}

// A row created with placement operator waits (STARTING, pool manual,
// owner operator); `apiary worker --queen --lifecycle-id` claims it once
// its model is loaded; the queen routes a completion to it; SIGKILLed,
// its row is FAILED (lost) by the queen's own health checks.
func TestProcessOperatorRowClaimedServedAndLost(t *testing.T) {
	const interval = 200 * time.Millisecond
	q := startHandRunQueen(t, t.TempDir(), "--claim-health-interval", interval.String())
	created, err := q.admin.CreateWorker(t.Context(), "tiny", api.PlacementOperator, "", "claim test")
	if err != nil {
		t.Fatal(err)
	}
	id, row := created.LifecycleID, created.Worker
	if row.Status != "STARTING" || row.PoolID != HandRunPool || row.Owner != OwnerOperator || row.ModelRef != "tiny" || row.URI != "" {
		t.Fatalf("created row: %+v", row)
	}

	w := startHandRunWorker(t, "worker", "--queen", q.url, "--lifecycle-id", id)
	_, next := q.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": id, "from": "STARTING", "to": "RUNNING"})
	rec, _ := w.logs.wait(t, 0, "row claimed at the queen", map[string]string{"lifecycle_id": id})
	row = q.row(t, id)
	if row.Status != "RUNNING" || row.URI != rec.Attrs["uri"] || row.WorkerID != id || row.VRAMBytes == 0 || row.PID == nil || *row.PID != w.cmd.Process.Pid {
		t.Errorf("claimed row: %+v (worker uri %s, pid %d)", row, rec.Attrs["uri"], w.cmd.Process.Pid)
	}
	if got := q.complete(t); got != id {
		t.Errorf("completion served by %q, want the claimed worker %s", got, id)
	}

	killed := time.Now()
	if err := w.stop(t, syscall.SIGKILL); err == nil {
		t.Fatal("worker exited cleanly after SIGKILL")
	}
	rec, _ = q.logs.wait(t, next, "lifecycle row changed", map[string]string{"lifecycle_id": id, "to": "FAILED"})
	took := logTime(t, rec).Sub(killed)
	t.Logf("row FAILED %s after kill -9 (health interval %s, %d failed checks)", took.Round(time.Millisecond), interval, ClaimHealthFailures)
	if !strings.HasPrefix(rec.Attrs["reason"], "lost: the worker run by hand") {
		t.Errorf("row failed with reason %q", rec.Attrs["reason"])
	}
	if limit := time.Duration(ClaimHealthFailures+1)*interval + 2*time.Second; took > limit {
		t.Errorf("row FAILED %s after the kill, want within %s", took, limit)
	}
	if err := q.stop(t, syscall.SIGTERM); err != nil {
		t.Errorf("queen exit: %v", err)
	}
}

// A row of placement operator that no worker claims within
// --claim-timeout is FAILED with reason unclaimed, and a worker that
// claims it after that is refused (409) and exits with an error.
func TestProcessOperatorRowUnclaimedFails(t *testing.T) {
	q := startHandRunQueen(t, t.TempDir(), "--claim-timeout", "300ms", "--claim-health-interval", "100ms")
	created, err := q.admin.CreateWorker(t.Context(), "tiny", api.PlacementOperator, "", "nobody comes")
	if err != nil {
		t.Fatal(err)
	}
	id := created.LifecycleID
	rec, _ := q.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": id, "to": "FAILED"})
	if !strings.HasPrefix(rec.Attrs["reason"], "unclaimed:") {
		t.Errorf("row failed with reason %q", rec.Attrs["reason"])
	}
	if at := logTime(t, rec); at.Before(created.Worker.CreatedAt.Add(300 * time.Millisecond)) {
		t.Errorf("row failed at %s, before its claim timeout (created %s)", at, created.Worker.CreatedAt)
	}
	w := startHandRunWorker(t, "late worker", "--queen", q.url, "--lifecycle-id", id)
	select {
	case <-w.done:
	case <-time.After(waitLimit):
		t.Fatal("a worker whose claim was refused did not exit")
	}
	if w.Err() == nil {
		t.Error("a worker whose claim was refused exited 0")
	}
	w.logs.wait(t, 0, "worker status changed", map[string]string{"to": "failed"})
	if !strings.Contains(w.logs.String(), "claim_refused") {
		t.Errorf("the worker's logs do not say the claim was refused:\n%s", w.logs.String())
	}
	if row := q.row(t, id); row.Status != "FAILED" {
		t.Errorf("row after the late claim: %+v", row)
	}
}

// `apiary worker --queen URL` without a lifecycle id gets a row of its
// own (pool manual, owner operator) and serves through the queen. The
// queen's shutdown leaves it running; the worker's own shutdown (SIGTERM)
// reaches the next queen on the same store: its row is STOPPED.
func TestProcessHandRunWorkerOwnRowOutlivesQueen(t *testing.T) {
	dir := t.TempDir()
	q := startHandRunQueen(t, dir)
	w := startHandRunWorker(t, "worker", "--queen", q.url)
	rec, _ := w.logs.wait(t, 0, "row claimed at the queen", nil)
	id := rec.Attrs["lifecycle_id"]
	row := q.row(t, id)
	if row.Status != "RUNNING" || row.PoolID != HandRunPool || row.Owner != OwnerOperator || row.ModelRef != "tiny" {
		t.Errorf("the worker's own row: %+v", row)
	}
	if got := q.complete(t); got != id {
		t.Errorf("completion served by %q, want %s", got, id)
	}

	if err := q.stop(t, syscall.SIGTERM); err != nil {
		t.Fatalf("queen exit: %v", err)
	}
	var h api.WorkerHealth
	if err := rpc.Do(t.Context(), transport.NewClient(nil, 5*time.Second), rpc.Call{URL: row.URI + "/health", Out: &h}); err != nil || h.Status != "ready" {
		t.Fatalf("the worker after the queen's shutdown: %+v %v", h, err)
	}

	q2 := startHandRunQueen(t, dir, "--addr", strings.TrimPrefix(q.url, "http://"))
	if err := w.stop(t, syscall.SIGTERM); err != nil {
		t.Fatalf("worker exit after SIGTERM: %v", err)
	}
	w.logs.wait(t, 0, "reported to the queen", map[string]string{"status": "STOPPED"})
	if row := q2.row(t, id); row.Status != "STOPPED" {
		t.Errorf("row after the worker's shutdown: %+v", row)
	}
	if err := q2.stop(t, syscall.SIGTERM); err != nil {
		t.Errorf("queen exit: %v", err)
	}
}

// `apiary workers stop ID` on a claimed row asks the worker to shut down
// (its /v1/admin/shutdown, with its token): the row is DRAINING, the
// worker exits 0, and its report makes the row STOPPED. An unclaimed row
// stops at once.
func TestProcessStopHandRunWorker(t *testing.T) {
	q := startHandRunQueen(t, t.TempDir())
	created, err := q.admin.CreateWorker(t.Context(), "tiny", api.PlacementOperator, "", "to be stopped")
	if err != nil {
		t.Fatal(err)
	}
	id := created.LifecycleID
	w := startHandRunWorker(t, "worker", "--queen", q.url, "--lifecycle-id", id)
	_, next := q.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": id, "to": "RUNNING"})
	stopped, err := q.admin.StopWorker(t.Context(), id, true, "done with it")
	if err != nil {
		t.Fatal(err)
	}
	if st := stopped.Worker.Status; st != "DRAINING" && st != "STOPPED" { // STOPPED: the worker's own report came first
		t.Errorf("row after the stop: %+v", stopped.Worker)
	}
	select {
	case <-w.done:
	case <-time.After(waitLimit):
		t.Fatal("the worker did not exit after the queen's stop")
	}
	if err := w.Err(); err != nil {
		t.Errorf("worker exit: %v", err)
	}
	q.logs.wait(t, next, "lifecycle row changed", map[string]string{"lifecycle_id": id, "to": "STOPPED"})

	unclaimed, err := q.admin.CreateWorker(t.Context(), "tiny", api.PlacementOperator, "", "never claimed")
	if err != nil {
		t.Fatal(err)
	}
	r, err := q.admin.StopWorker(t.Context(), unclaimed.LifecycleID, false, "changed my mind")
	if err != nil || r.Worker.Status != "STOPPED" {
		t.Errorf("stop of an unclaimed row: %+v %v", r.Worker, err)
	}
	if err := q.stop(t, syscall.SIGTERM); err != nil {
		t.Errorf("queen exit: %v", err)
	}
}

// Bad claims and creates get a clear 4xx: no cluster token, an invalid or
// unknown lifecycle id, a row of another model, a row no longer
// STARTING, a worker that does not serve the claimed model or refuses
// the claimed token; placement with pool_id or an unknown placement; a
// hive registering as pool manual.
func TestProcessClaimRefusals(t *testing.T) {
	q := startHandRunQueen(t, t.TempDir())
	w := startHandRunWorker(t, "standalone worker") // no --queen: claims are made by the test
	w.logs.wait(t, 0, "serving", nil)
	lrec, _ := w.logs.wait(t, 0, "listening", nil)
	uri := "http://" + lrec.Attrs["addr"]
	ctx := t.Context()
	other, err := q.admin.CreateWorker(ctx, "other", api.PlacementOperator, "", "a row of another model")
	if err != nil {
		t.Fatal(err)
	}
	good, err := q.admin.CreateWorker(ctx, "tiny", api.PlacementOperator, "", "claimed twice")
	if err != nil {
		t.Fatal(err)
	}
	claim := func(token string, c api.WorkerClaim) (int, string) {
		t.Helper()
		err := rpc.Do(ctx, transport.NewClient(nil, 10*time.Second), rpc.Call{Method: http.MethodPost, URL: q.url + "/v2/workers/claim",
			Token: token, In: c})
		var se *rpc.StatusError
		if errors.As(err, &se) {
			return se.Status, se.Code
		}
		if err != nil {
			t.Fatal(err)
		}
		return http.StatusOK, ""
	}
	ok := api.WorkerClaim{LifecycleID: good.LifecycleID, ModelRef: "tiny", URI: uri, WorkerToken: claimWorkerToken, VRAMBytes: 1}
	if st, code := claim(claimClusterToken, ok); st != http.StatusOK {
		t.Fatalf("a good claim: %d %s", st, code)
	}
	with := func(f func(*api.WorkerClaim)) api.WorkerClaim { c := ok; f(&c); return c }
	cases := []struct {
		name   string
		token  string
		claim  api.WorkerClaim
		status int
		code   string
	}{
		{"no token", "", ok, http.StatusUnauthorized, "unauthorized"},
		{"the admin token", claimAdminToken, ok, http.StatusUnauthorized, "unauthorized"},
		{"invalid id", claimClusterToken, with(func(c *api.WorkerClaim) { c.LifecycleID = "wk-1" }), http.StatusBadRequest, "invalid_request"},
		{"unknown id", claimClusterToken, with(func(c *api.WorkerClaim) { c.LifecycleID = "wk-0000000000000000" }), http.StatusNotFound, "worker_not_found"},
		{"row of another model", claimClusterToken, with(func(c *api.WorkerClaim) { c.LifecycleID = other.LifecycleID }), http.StatusConflict, "claim_refused"},
		{"row not STARTING", claimClusterToken, with(func(c *api.WorkerClaim) { c.URI = "http://127.0.0.1:1" }), http.StatusConflict, "claim_refused"},
		{"claim again with a token the worker refuses", claimClusterToken, with(func(c *api.WorkerClaim) { c.WorkerToken = "wrong-0123456789abcdef" }),
			http.StatusUnprocessableEntity, "claim_unverified"},
		{"claim again for another model", claimClusterToken, with(func(c *api.WorkerClaim) { c.ModelRef = "other" }), http.StatusConflict, "claim_refused"},
		{"claim again without the cluster token", claimAdminToken, ok, http.StatusUnauthorized, "unauthorized"},
		{"claim again", claimClusterToken, ok, http.StatusOK, ""},
		{"worker serves another model", claimClusterToken, with(func(c *api.WorkerClaim) { c.LifecycleID, c.ModelRef = other.LifecycleID, "other" }),
			http.StatusUnprocessableEntity, "claim_unverified"},
		{"wrong worker token", claimClusterToken, with(func(c *api.WorkerClaim) { c.LifecycleID, c.WorkerToken = "", "wrong-0123456789abcdef" }),
			http.StatusUnprocessableEntity, "claim_unverified"},
		{"no worker there", claimClusterToken, with(func(c *api.WorkerClaim) { c.LifecycleID, c.URI = "", "http://127.0.0.1:1" }),
			http.StatusUnprocessableEntity, "claim_unverified"},
		{"bad uri", claimClusterToken, with(func(c *api.WorkerClaim) { c.URI = "ftp://x" }), http.StatusBadRequest, "invalid_request"},
		{"bad model", claimClusterToken, with(func(c *api.WorkerClaim) { c.ModelRef = "../x" }), http.StatusBadRequest, "invalid_request"},
	}
	for _, tc := range cases {
		st, code := claim(tc.token, tc.claim)
		if st != tc.status || code != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.name, st, code, tc.status, tc.code)
		}
	}
	if r := q.row(t, other.LifecycleID); r.Status != "STARTING" {
		t.Errorf("the row of another model after refused claims: %+v", r)
	}
	if r := q.row(t, good.LifecycleID); r.Status != "RUNNING" || r.URI != uri {
		t.Errorf("the claimed row after claims again: %+v", r)
	}
	if n := auditCount(t, q, good.LifecycleID, "worker.claimed"); n != 1 {
		t.Errorf("%d worker.claimed audit entries for the row claimed again, want 1", n)
	}

	post := func(path, token string, body any) (int, string) {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, q.url+path, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e.Error.Code
	}
	bad := []struct {
		name, path, token string
		body              any
		status            int
	}{
		{"operator with pool_id", "/api/admin/workers", claimAdminToken,
			api.AdminWorkerRequest{Action: api.ActionCreate, Model: "tiny", Placement: api.PlacementOperator, PoolID: "node-1", Reason: "r"}, http.StatusBadRequest},
		{"unknown placement", "/api/admin/workers", claimAdminToken,
			api.AdminWorkerRequest{Action: api.ActionCreate, Model: "tiny", Placement: "somewhere", Reason: "r"}, http.StatusBadRequest},
		{"placement on start", "/api/admin/workers", claimAdminToken,
			api.AdminWorkerRequest{Action: api.ActionStart, Model: "tiny", Placement: api.PlacementOperator, Reason: "r"}, http.StatusBadRequest},
		{"create without reason", "/api/admin/workers", claimAdminToken,
			api.AdminWorkerRequest{Action: api.ActionCreate, Model: "tiny", Placement: api.PlacementOperator}, http.StatusBadRequest},
		{"a hive as pool manual", "/v2/pools/register", claimClusterToken,
			api.RegisterPool{PoolID: HandRunPool, Endpoint: "http://127.0.0.1:1"}, http.StatusBadRequest},
		{"report of an unknown status", "/v2/workers/" + good.LifecycleID + "/report", claimClusterToken,
			api.WorkerReport{Status: "RUNNING", Reason: "r"}, http.StatusBadRequest},
	}
	for _, tc := range bad {
		if st, code := post(tc.path, tc.token, tc.body); st != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.name, st, code, tc.status)
		}
	}
	// An auto create is a start: with no pool, there is none to place on.
	if _, err := q.admin.CreateWorker(ctx, "tiny", api.PlacementAuto, "", "auto"); err == nil || !strings.Contains(err.Error(), "no_pool_available") {
		t.Errorf("auto create without pools: %v", err)
	}
	rows, err := q.admin.Workers(ctx, keeper.WorkerFilter{PoolID: HandRunPool})
	if err != nil {
		t.Fatal(err)
	}
	var statuses []string
	for _, r := range rows {
		statuses = append(statuses, r.ModelRef+" "+r.Status)
	}
	if diff := cmp.Diff([]string{"tiny RUNNING", "other STARTING"}, statuses); diff != "" {
		t.Errorf("rows of pool manual (-want +got):\n%s", diff)
	}
}

// auditCount counts the audit entries of action on target.
func auditCount(t *testing.T, q *handRunQueen, target, action string) int {
	t.Helper()
	entries, err := q.admin.Audit(t.Context(), "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if e.Target == target && e.Action == action {
			n++
		}
	}
	return n
}

// models returns the ids GET /v1/models lists through the queen.
func (q *handRunQueen) models(t *testing.T) []string {
	t.Helper()
	page, err := q.oai.Models.List(t.Context())
	if err != nil {
		t.Fatalf("GET /v1/models: %v", err)
	}
	var ids []string
	for _, m := range page.Data {
		ids = append(ids, m.ID)
	}
	return ids
}

// A restarted queen has lost the token of a worker run by hand (it keeps
// it in memory only); the worker claims its row again every
// --claim-interval, so the new queen routes to it again within an
// interval, without a change of the row or a new audit entry, and
// `workers stop` reaches it. GET /v1/models lists the model of the worker
// run by hand, which no pool lists, on both queens.
func TestProcessHandRunWorkerClaimsAgainAfterQueenRestart(t *testing.T) {
	const interval = 300 * time.Millisecond
	dir := t.TempDir()
	q := startHandRunQueen(t, dir)
	w := startHandRunWorker(t, "worker", "--queen", q.url, "--claim-interval", interval.String())
	rec, _ := w.logs.wait(t, 0, "row claimed at the queen", nil)
	id := rec.Attrs["lifecycle_id"]
	if diff := cmp.Diff([]string{"tiny"}, q.models(t)); diff != "" {
		t.Errorf("GET /v1/models with a worker run by hand (-want +got):\n%s", diff)
	}
	if got := q.complete(t); got != id {
		t.Errorf("completion served by %q, want %s", got, id)
	}
	if err := q.stop(t, syscall.SIGTERM); err != nil {
		t.Fatalf("queen exit: %v", err)
	}

	q2 := startHandRunQueen(t, dir, "--addr", strings.TrimPrefix(q.url, "http://"))
	served, _ := q2.logs.wait(t, 0, "queen serving", nil)
	again, _ := q2.logs.wait(t, 0, "worker run by hand claimed its row again", map[string]string{"lifecycle_id": id, "token_known": "false"})
	took := logTime(t, again).Sub(logTime(t, served))
	t.Logf("the restarted queen learned the worker's token %s after it served (claim interval %s)", took.Round(time.Millisecond), interval)
	if limit := interval + 2*time.Second; took > limit {
		t.Errorf("the worker claimed its row again %s after the queen restarted, want within %s", took, limit)
	}
	if got := q2.complete(t); got != id {
		t.Errorf("completion through the restarted queen served by %q, want %s", got, id)
	}
	if diff := cmp.Diff([]string{"tiny"}, q2.models(t)); diff != "" {
		t.Errorf("GET /v1/models of the restarted queen (-want +got):\n%s", diff)
	}
	if row := q2.row(t, id); row.Status != "RUNNING" {
		t.Errorf("row after claims again: %+v", row)
	}
	if n := auditCount(t, q2, id, "worker.claimed"); n != 1 {
		t.Errorf("%d worker.claimed audit entries, want 1 (claims again write none)", n)
	}

	stopped, err := q2.admin.StopWorker(t.Context(), id, true, "stop through the restarted queen")
	if err != nil {
		t.Fatalf("workers stop through the restarted queen: %v", err)
	}
	if st := stopped.Worker.Status; st != "DRAINING" && st != "STOPPED" {
		t.Errorf("row after the stop: %+v", stopped.Worker)
	}
	select {
	case <-w.done:
	case <-time.After(waitLimit):
		t.Fatal("the worker did not exit after the restarted queen's stop")
	}
	if err := w.Err(); err != nil {
		t.Errorf("worker exit: %v", err)
	}
	q2.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": id, "to": "STOPPED"})
	if err := q2.stop(t, syscall.SIGTERM); err != nil {
		t.Errorf("queen exit: %v", err)
	}
}

// A worker run by hand whose row ended at the queen (here stopped while
// the queen could not reach the worker: the row is FAILED by its health
// checks) learns it from the answer to its next claim (409) and shuts
// down with an error instead of serving on unrouted.
func TestProcessHandRunWorkerStopsWhenItsRowEnded(t *testing.T) {
	q := startHandRunQueen(t, t.TempDir(), "--claim-health-interval", "100ms")
	w := startHandRunWorker(t, "worker", "--queen", q.url, "--claim-interval", "200ms")
	rec, _ := w.logs.wait(t, 0, "row claimed at the queen", nil)
	id := rec.Attrs["lifecycle_id"]
	// The worker stops answering (SIGSTOP) until its row is FAILED, then
	// goes on.
	w.Signal(syscall.SIGSTOP)
	q.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": id, "to": "FAILED"})
	w.Signal(syscall.SIGCONT)
	select {
	case <-w.done:
	case <-time.After(waitLimit):
		t.Fatal("a worker whose row ended did not exit")
	}
	if w.Err() == nil {
		t.Error("a worker whose row ended exited 0")
	}
	w.logs.wait(t, 0, "row lost at the queen; shutting down", map[string]string{"lifecycle_id": id})
	if row := q.row(t, id); row.Status != "FAILED" {
		t.Errorf("row after the worker shut down: %+v", row)
	}
}

// A worker run by hand given two queens on one PostgreSQL database, the
// standby first (--queen STANDBY,ACTIVE), claims its row at the active
// one, which routes to it; after the active queen is SIGKILLed and the
// standby took over, the worker claims its row again at the new active
// queen (the dead one refuses the connection), which routes to it: the
// same row, the same process.
func TestProcessHandRunWorkerFollowsTheActiveQueen(t *testing.T) {
	const interval = 300 * time.Millisecond
	u, err := pg.NewDatabase(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	addrs := []string{testbin.FreeAddr(t), testbin.FreeAddr(t)}
	urls := []string{"http://" + addrs[0], "http://" + addrs[1]}
	q1 := startHandRunQueen(t, t.TempDir(), "--addr", addrs[0], "--database-url", u)
	env := []string{"APIARY_API_TOKEN=" + claimAPIToken, "APIARY_ADMIN_TOKEN=" + claimAdminToken, "APIARY_CLUSTER_TOKEN=" + claimClusterToken}
	p2 := startProc(t, "queen 2", env, "queen", "--addr", addrs[1], "--database-url", u, "--data-dir", t.TempDir(), "--flush-interval", "100ms")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("queen 2 logs:\n%s", p2.logs.String())
		}
		_ = p2.stop(t, syscall.SIGTERM)
	})
	p2.logs.wait(t, 0, "queen standing by: another queen holds the database", map[string]string{"active": urls[0]})
	q2 := &handRunQueen{proc: p2, url: urls[1], admin: keeper.NewClient(urls[1], claimAdminToken, claimClusterToken),
		oai: oai.NewClient(option.WithBaseURL(urls[1]+"/v1/"), option.WithAPIKey(claimAPIToken), option.WithMaxRetries(0))}

	w := startHandRunWorker(t, "worker", "--queen", urls[1]+","+urls[0], "--claim-interval", interval.String())
	rec, _ := w.logs.wait(t, 0, "row claimed at the queen", map[string]string{"queen_url": urls[0]})
	id := rec.Attrs["lifecycle_id"]
	if got := q1.complete(t); got != id {
		t.Errorf("completion through the active queen served by %q, want %s", got, id)
	}

	_ = q1.stop(t, syscall.SIGKILL)
	p2.logs.wait(t, 0, "queen serving", nil)
	p2.logs.wait(t, 0, "worker run by hand claimed its row again", map[string]string{"lifecycle_id": id})
	if got := q2.complete(t); got != id {
		t.Errorf("completion through the queen that took over served by %q, want %s", got, id)
	}
	if row := q2.row(t, id); row.Status != "RUNNING" || row.PID == nil || *row.PID != w.cmd.Process.Pid {
		t.Errorf("the row at the queen that took over: %+v, want RUNNING with pid %d", row, w.cmd.Process.Pid)
	}
	if err := w.stop(t, syscall.SIGTERM); err != nil {
		t.Errorf("worker exit: %v", err)
	}
	p2.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": id, "to": "STOPPED"})
}
