package hive

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/api"
)

// Regression (issue 40): a deposed queen that had not noticed could stop
// the new active's workers. A hive refuses a command of an older fencing
// epoch than the newest it has seen, learnt from a heartbeat's answer or
// a command; a command without an epoch is not fenced.
func TestHiveRefusesCommandsOfAnOlderQueenEpoch(t *testing.T) {
	q := newFakeQueen(t, "cluster-token")
	q.set(func() { q.epoch = 5 })
	th := startHive(t, withQueen(q))
	// The second heartbeat goes after the first one's answer was read.
	q.until(t, "two heartbeats", func() bool { return len(q.heartbeats) > 1 })
	if got := th.queenEpoch.Load(); got != 5 {
		t.Fatalf("epoch learnt from the heartbeat's answer: %d, want 5", got)
	}
	command := func(epoch string, path string, body any) (int, api.Error) {
		t.Helper()
		b, _ := json.Marshal(body)
		req, err := http.NewRequest(http.MethodPost, th.url+path, bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer cluster-token")
		if epoch != "" {
			req.Header.Set(api.QueenEpochHeader, epoch)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out api.Error
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	start := api.StartWorkerRequest{ModelRef: "tiny", LifecycleID: "wk-fenced"}
	for _, tc := range []struct {
		what, epoch, path string
		body              any
	}{
		{"a start of epoch 4", "4", "/v2/workers/start", start},
		{"a stop of epoch 4", "4", "/v2/workers/w-none/stop", api.StopWorkerRequest{}},
	} {
		code, out := command(tc.epoch, tc.path, tc.body)
		if code != http.StatusConflict || out.Error.Code != "stale_queen" ||
			!strings.Contains(out.Error.Message, "its fencing epoch 4 is older than epoch 5, which this hive has seen") {
			t.Errorf("%s: %d %+v, want 409 stale_queen", tc.what, code, out.Error)
		}
	}
	if ws, _ := th.reg.heartbeat(); len(ws) != 0 {
		t.Errorf("the refused start ran a worker: %+v", ws)
	}
	// A command of a newer epoch is taken and raises the newest seen.
	if code, out := command("6", "/v2/workers/w-none/stop", api.StopWorkerRequest{}); code != http.StatusNotFound {
		t.Errorf("a stop of epoch 6: %d %+v, want 404 worker_not_found (it passed the fence)", code, out.Error)
	}
	if code, out := command("5", "/v2/workers/w-none/stop", api.StopWorkerRequest{}); code != http.StatusConflict || out.Error.Code != "stale_queen" {
		t.Errorf("a stop of epoch 5 after one of 6: %d %+v, want 409 stale_queen", code, out.Error)
	}
	if code, out := command("", "/v2/workers/w-none/stop", api.StopWorkerRequest{}); code != http.StatusNotFound {
		t.Errorf("a stop without an epoch: %d %+v, want 404 (not fenced)", code, out.Error)
	}
	if code, _ := command("x", "/v2/workers/w-none/stop", api.StopWorkerRequest{}); code != http.StatusBadRequest {
		t.Errorf("a stop with epoch %q: %d, want 400", "x", code)
	}
}
