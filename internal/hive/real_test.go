package hive

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/lifecycle"
)

// Happy paths with real `apiary worker` processes and the generated model.

func TestRealWorkerSpawnServeStop(t *testing.T) {
	th := startHive(t, withReal(t))
	id := th.start()
	ready := th.rec.wait(t, id, lifecycle.Ready)
	if ready.Worker.VRAMBytes == 0 || !strings.HasPrefix(ready.Worker.URI, "http://127.0.0.1:") {
		t.Fatalf("ready worker = %+v", ready.Worker)
	}
	text, err := realCompletion(ready)
	if err != nil {
		t.Fatal(err)
	}
	if text.Usage.CompletionTokens != 4 || len(text.Choices) != 1 {
		t.Errorf("completion = %+v", text)
	}
	if code := th.do("POST", "/v2/workers/"+id+"/stop", api.StopWorkerRequest{Drain: true}, nil); code != http.StatusAccepted {
		t.Fatalf("stop: %d", code)
	}
	ev := th.rec.wait(t, id, lifecycle.Stopped)
	if !strings.Contains(ev.Reason, "graceful stop: exit code 0") {
		t.Errorf("reason = %q", ev.Reason)
	}
	end := th.gone(id)
	portFree(t, end.URI)
}

func TestRealWorkerCascadeOfSeveral(t *testing.T) {
	th := startHive(t, withReal(t))
	ids := make([]string, 3)
	for i := range ids {
		ids[i] = th.start()
	}
	for _, id := range ids {
		th.rec.wait(t, id, lifecycle.Ready)
	}
	snaps := map[string]api.Worker{}
	for _, id := range ids {
		snaps[id] = th.worker(id)
	}
	th.Shutdown()
	select {
	case err := <-th.runErr:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		th.runErr <- nil // for the cleanup
	case <-time.After(waitLimit):
		t.Fatal("cascade did not finish")
	}
	for _, id := range ids {
		ev := th.rec.wait(t, id, lifecycle.Stopped)
		if !strings.Contains(ev.Reason, "graceful") {
			t.Errorf("%s: %q", id, ev.Reason)
		}
		assertNoProcess(t, snaps[id].PID)
	}
	if l := th.reg.list(false); len(l) != 0 {
		t.Errorf("registry not cleared: %+v", l)
	}
}

func TestWhatDiesWhen_AfterIdleTimeout_WorkerDiesHiveLives(t *testing.T) {
	th := startHive(t, withReal(t), func(c *Config) { c.IdleTimeout = 500 * time.Millisecond; c.HealthInterval = 100 * time.Millisecond })
	id := th.start()
	ready := th.rec.wait(t, id, lifecycle.Ready)
	if _, err := realCompletion(ready); err != nil {
		t.Fatal(err)
	}
	served := time.Now()
	ev := th.rec.wait(t, id, lifecycle.Draining)
	if !strings.Contains(ev.Reason, "idle") || ev.At.Sub(served) < 400*time.Millisecond {
		t.Errorf("idle stop %q %s after the request", ev.Reason, ev.At.Sub(served))
	}
	th.rec.wait(t, id, lifecycle.Stopped)
	th.gone(id)
	var h api.Health
	if code := th.do("GET", "/health", nil, &h); code != 200 || h.Status != "ok" {
		t.Errorf("hive after the idle stop: %d %+v", code, h)
	}
}

type completionAnswer struct {
	Choices []struct {
		Text string `json:"text"`
	} `json:"choices"`
	Usage struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// realCompletion asks the worker of ready directly, with the token its
// hive gave it (from the event the test recorded).
func realCompletion(ready api.WorkerEvent) (completionAnswer, error) {
	var out completionAnswer
	req, _ := http.NewRequest(http.MethodPost, ready.Worker.URI+"/v1/completions",
		strings.NewReader(`{"model":"tiny","prompt":"hello","max_tokens":4,"temperature":0}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+ready.WorkerToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return out, &httpError{resp.Status, string(b)}
	}
	return out, json.Unmarshal(b, &out)
}

type httpError struct{ status, body string }

func (e *httpError) Error() string { return e.status + ": " + e.body }
