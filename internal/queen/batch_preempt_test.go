package queen

// In-process tests of interactive requests taking the slots of batch
// requests: a queen on SQLite, one fake worker whose batch answers wait
// until the test lets them go.

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/routing"
)

// heldWorker answers streams at once (two tokens), and holds every
// other answer (the batch's) until release is called; started receives each held request as it arrives, cancelled
// each one whose client went away.
type heldWorker struct {
	*httptest.Server
	started, cancelled chan string
	release            func()
}

func newHeldWorker(t *testing.T) *heldWorker {
	gate := make(chan struct{})
	hw := &heldWorker{started: make(chan string, 64), cancelled: make(chan string, 64), release: sync.OnceFunc(func() { close(gate) })}
	hw.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			openai.WriteJSON(w, http.StatusOK, api.WorkerHealth{Status: "ready", Model: "tiny"})
			return
		}
		var req struct {
			Stream   bool `json:"stream"`
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		if req.Stream {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			rc := http.NewResponseController(w)
			_, _ = w.Write([]byte("data: {\"choices\":[{\"text\":\"a\"}]}\n\n"))
			_ = rc.Flush()
			_, _ = w.Write([]byte("data: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n"))
			return
		}
		what := req.Messages[0].Content
		hw.started <- what
		select {
		case <-gate:
		case <-r.Context().Done():
			hw.cancelled <- what
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"tiny","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`))
	}))
	t.Cleanup(hw.Close)
	t.Cleanup(hw.release)
	return hw
}

func recv(t *testing.T, c <-chan string, what string) string {
	t.Helper()
	select {
	case s := <-c:
		return s
	case <-time.After(waitLimit):
		t.Fatalf("no %s within %s", what, waitLimit)
		return ""
	}
}

// streamAll sends a streamed completion and reads it to its end; it
// returns the status and the events' data.
func (x *tq) streamAll(t *testing.T, prompt string) (int, []string) {
	t.Helper()
	resp := x.post(t.Context(), "/v1/completions", `{"model":"tiny","prompt":"`+prompt+`","stream":true}`)
	defer resp.Body.Close()
	var events []string
	br := bufio.NewReader(resp.Body)
	for {
		ev, err := nextEvent(br)
		if err != nil {
			return resp.StatusCode, events
		}
		events = append(events, ev)
	}
}

// A batch holds both slots of the only worker: an interactive request
// takes the youngest batch request's slot at once (that request is
// cancelled at the worker, the interactive one is answered while the
// other batch request still runs), the preempted job goes back to the
// queue with no attempt counted, and the batch completes with every
// request's line exactly once.
func TestBatchPreemptedByInteractive(t *testing.T) {
	x, _ := routeQueen(t, map[string][]api.Model{"http://127.0.0.1:1": {tinyModel}}, func(c *Config) {
		c.Routing = routing.Config{WorkerSlots: 2, MaxWorkers: 1, QueueTimeout: time.Minute}
	})
	x.registerAt("node-1", "http://127.0.0.1:1")
	hw := newHeldWorker(t)
	x.readyWorker("node-1", hw.URL)
	client := oai.NewClient(option.WithBaseURL(x.url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))

	const n = 3
	id := newBatch(t, client, n, 8)
	first := recv(t, hw.started, "first batch request")
	second := recv(t, hw.started, "second batch request")
	t.Logf("batch requests on the worker: %q, %q", first, second)

	status, events := x.streamAll(t, "hi")
	if status != http.StatusOK || len(events) != 3 || events[2] != "[DONE]" {
		t.Fatalf("interactive request while the batch holds every slot: %d %q", status, events)
	}
	// The worker saw one batch request go (the youngest: which one that
	// is, TestRouterPreemptsYoungestBatch checks); the other still runs
	// (nothing was released yet).
	if got := recv(t, hw.cancelled, "cancelled batch request"); got != first && got != second {
		t.Errorf("cancelled %q, not one of the running batch requests", got)
	}
	select {
	case got := <-hw.cancelled:
		t.Errorf("a second batch request was cancelled: %q", got)
	default:
	}
	if m := metricLine(x, `apiary_queen_batch_preemptions_total{model="tiny"}`); m != "1" {
		t.Errorf("preemption metric: %q", m)
	}
	rec, _ := x.logs.wait(t, 0, "job attempt ended", map[string]string{"batch_id": id, "state": "queued", "preempted": "true"})
	if rec.Attrs["attempts"] != "0" || rec.Attrs["lifecycle_id"] != "" {
		t.Errorf("the preempted job's attempt was counted: %v", rec.Attrs)
	}

	hw.release()
	b := x.waitBatchEnd(t, client, id)
	completedOnce(t, client, b, n)
	if x.logs.Has("job attempt ended", map[string]string{"batch_id": id, "state": "queued", "preempted": "false"}) {
		t.Error("a job was queued again for another reason than the preemption")
	}

}

// waitBatchEnd waits for the queen's log of the batch's end and returns
// the batch as the client reads it then.
func (x *tq) waitBatchEnd(t *testing.T, client oai.Client, id string) *oai.Batch {
	t.Helper()
	x.logs.wait(t, 0, "batch ended", map[string]string{"batch_id": id})
	b, err := client.Batches.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
