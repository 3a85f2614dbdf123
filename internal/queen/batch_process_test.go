//go:build !race

package queen

// The OpenAI Batch API end to end: the real apiary binary as queen and
// hive, real workers on the generated test model, the official OpenAI Go
// client as the user.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/apiary-llm/apiary/internal/testmodel"
)

// waitBatch waits for the queen's log of the batch's end and returns the
// batch as the client reads it then.
func (c *cluster) waitBatch(t *testing.T, id string) *oai.Batch {
	t.Helper()
	c.queen.logs.wait(t, 0, "batch ended", map[string]string{"batch_id": id})
	b, err := c.client.Batches.Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A batch of 100 chat requests, uploaded, created, polled and downloaded
// with the official client, completes with one result line a request,
// each custom_id once; the files and batches are listed; a malformed
// line is refused at upload with its line number; a batch whose endpoint
// is not its lines' url is refused with a 400 that says why.
func TestProcessBatchCompletes(t *testing.T) {
	c := startCluster(t, []string{"--max-workers", "2"})
	ctx := t.Context()
	const n = 100
	f, err := upload(t, c.client, batchFile(n, 2))
	if err != nil {
		t.Fatal(err)
	}
	if f.Purpose != "batch" || f.Bytes == 0 || !strings.HasPrefix(f.ID, "file-") {
		t.Fatalf("uploaded file: %+v", f)
	}
	b, err := c.client.Batches.New(ctx, oai.BatchNewParams{InputFileID: f.ID, Endpoint: oai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: oai.BatchNewParamsCompletionWindow24h})
	if err != nil {
		t.Fatal(err)
	}
	if b.Status != oai.BatchStatusInProgress || b.RequestCounts.Total != n {
		t.Fatalf("new batch: status %s, counts %+v", b.Status, b.RequestCounts)
	}
	b = c.waitBatch(t, b.ID)
	if b.Status != oai.BatchStatusCompleted || b.RequestCounts.Completed != n || b.RequestCounts.Failed != 0 || b.OutputFileID == "" ||
		b.ErrorFileID != "" || b.CompletedAt == 0 || b.FinalizingAt == 0 {
		t.Fatalf("ended batch: status %s, counts %+v, output %q, errors %q", b.Status, b.RequestCounts, b.OutputFileID, b.ErrorFileID)
	}
	out := results(t, c.client, b.OutputFileID)
	onceEach(t, n, out)
	for _, l := range out {
		var body oai.ChatCompletion
		if l.Response == nil || l.Response.StatusCode != http.StatusOK || json.Unmarshal(l.Response.Body, &body) != nil ||
			len(body.Choices) != 1 || body.Usage.CompletionTokens != 2 {
			t.Fatalf("result line of %s: %+v", l.CustomID, l)
		}
	}

	page, err := c.client.Batches.List(ctx, oai.BatchListParams{})
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != b.ID {
		t.Fatalf("batches list: %+v, %v", page, err)
	}
	files, err := c.client.Files.List(ctx, oai.FileListParams{})
	if err != nil || len(files.Data) != 2 {
		t.Fatalf("files list: %+v, %v", files, err)
	}
	got, err := c.client.Files.Get(ctx, b.OutputFileID)
	if err != nil || got.Purpose != "batch_output" {
		t.Fatalf("output file: %+v, %v", got, err)
	}
	audit, err := c.admin.Audit(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, e := range audit {
		if e.Target == b.ID {
			actions = append(actions, e.Action)
		}
	}
	if strings.Join(actions, ",") != "batch.completed,batch.created" {
		t.Errorf("audit of the batch, newest first: %v", actions)
	}

	// A malformed line is refused at upload, naming its line.
	bad := batchFile(2, 2) + `{"custom_id":"req-2","method":"POST","url":"/v1/chat/completions","body":{"model":"tiny"}}` + "\n"
	_, err = upload(t, c.client, bad)
	var apiErr *oai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || !strings.Contains(apiErr.Message, "line 3: body.messages") {
		t.Fatalf("malformed upload: %v", err)
	}
	// Chat lines under the embeddings endpoint: refused with why.
	_, err = c.client.Batches.New(ctx, oai.BatchNewParams{InputFileID: f.ID, Endpoint: oai.BatchNewParamsEndpointV1Embeddings,
		CompletionWindow: oai.BatchNewParamsCompletionWindow24h})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest ||
		!strings.Contains(apiErr.Message, "but the batch's endpoint is /v1/embeddings") {
		t.Fatalf("chat lines in an embeddings batch: %v", err)
	}
	// A deleted file is gone.
	if d, err := c.client.Files.Delete(ctx, f.ID); err != nil || !d.Deleted {
		t.Fatalf("delete: %+v, %v", d, err)
	}
	if _, err := c.client.Files.Get(ctx, f.ID); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Fatalf("deleted file: %v", err)
	}
}

// A batch of embeddings requests, with the official client, completes
// with one result line a request, each the embeddings answer: one vector
// of the model's dimension a request.
func TestProcessBatchEmbeddings(t *testing.T) {
	const dim = 96 // not testmodel's default: the vectors are the model's
	c := startClusterWith(t, clusterOptions{model: testmodel.Options{Dim: dim}}, nil)
	const n = 4
	var in strings.Builder
	for i := range n {
		fmt.Fprintf(&in, `{"custom_id":"req-%d","method":"POST","url":"/v1/embeddings","body":{"model":"tiny","input":"The bees of hive %d"}}`+"\n", i, i)
	}
	f, err := upload(t, c.client, in.String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.client.Batches.New(t.Context(), oai.BatchNewParams{InputFileID: f.ID, Endpoint: oai.BatchNewParamsEndpointV1Embeddings,
		CompletionWindow: oai.BatchNewParamsCompletionWindow24h})
	if err != nil {
		t.Fatal(err)
	}
	b = c.waitBatch(t, b.ID)
	if b.Status != oai.BatchStatusCompleted || b.RequestCounts.Completed != n || b.RequestCounts.Failed != 0 || b.ErrorFileID != "" {
		t.Fatalf("ended batch: status %s, counts %+v, errors %+v", b.Status, b.RequestCounts, b.Errors)
	}
	out := results(t, c.client, b.OutputFileID)
	onceEach(t, n, out)
	for _, l := range out {
		var body oai.CreateEmbeddingResponse
		if l.Response == nil || l.Response.StatusCode != http.StatusOK || json.Unmarshal(l.Response.Body, &body) != nil ||
			len(body.Data) != 1 || len(body.Data[0].Embedding) != dim || body.Usage.PromptTokens == 0 {
			t.Fatalf("result line of %s: %+v", l.CustomID, l)
		}
	}
}

// A batch cancelled mid-way ends cancelled: the requests that ran are in
// the output file, the others in the error file as batch_cancelled, each
// custom_id once. The requests the dispatcher had taken that still waited
// for the worker's one slot are cancelled too, at once: only the one
// running then finishes.
func TestProcessBatchCancel(t *testing.T) {
	c := startCluster(t, []string{"--log-level", "debug"})
	ctx := t.Context()
	const n = 100
	f, err := upload(t, c.client, batchFile(n, 64))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.client.Batches.New(ctx, oai.BatchNewParams{InputFileID: f.ID, Endpoint: oai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: oai.BatchNewParamsCompletionWindow24h})
	if err != nil {
		t.Fatal(err)
	}
	c.queen.logs.wait(t, 0, "job attempt ended", map[string]string{"batch_id": b.ID, "state": "succeeded"})
	cb, err := c.client.Batches.Cancel(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	if cb.Status != oai.BatchStatusCancelling && cb.Status != oai.BatchStatusCancelled {
		t.Fatalf("cancelled batch: %s", cb.Status)
	}
	c.queen.logs.wait(t, 0, "job attempt ended", map[string]string{"batch_id": b.ID, "state": "cancelled"})
	b = c.waitBatch(t, b.ID)
	// One slot: the request running at the cancel, one that took the slot
	// it freed before the cancel reached the queue, and one whose end was
	// not written yet, may still end.
	if ran := b.RequestCounts.Completed - cb.RequestCounts.Completed; ran > 3 {
		t.Errorf("%d requests completed after the cancel (%d before it): those waiting for the slot ran", ran, cb.RequestCounts.Completed)
	}
	if b.Status != oai.BatchStatusCancelled || b.CancelledAt == 0 || b.RequestCounts.Completed == 0 || b.RequestCounts.Failed == 0 ||
		b.RequestCounts.Completed+b.RequestCounts.Failed != n {
		t.Fatalf("ended batch: status %s, counts %+v", b.Status, b.RequestCounts)
	}
	out, errs := results(t, c.client, b.OutputFileID), results(t, c.client, b.ErrorFileID)
	onceEach(t, n, out, errs)
	for _, l := range errs {
		if l.Error == nil || l.Error.Code != "batch_cancelled" {
			t.Fatalf("error line: %+v", l)
		}
	}
	if len(out) != int(b.RequestCounts.Completed) {
		t.Errorf("%d output lines, %d completed", len(out), b.RequestCounts.Completed)
	}
	// A second cancel answers the batch as it is; cancelling an ended
	// batch of another kind is a conflict.
	if again, err := c.client.Batches.Cancel(ctx, b.ID); err != nil || again.Status != oai.BatchStatusCancelled {
		t.Fatalf("second cancel: %+v, %v", again, err)
	}
}

// kill -9 of the worker during a batch: the request it was serving is
// tried again on the worker the controller places next, and every
// request ends exactly once, succeeded.
func TestProcessBatchWorkerKilled(t *testing.T) {
	c := startCluster(t, []string{"--log-level", "debug"})
	const n = 30
	id := newBatch(t, c.client, n, 32)
	c.queen.logs.wait(t, 0, "job attempt ended", map[string]string{"batch_id": id, "state": "succeeded"})
	rows := c.rows()
	if len(rows) != 1 || rows[0].PID == nil {
		t.Fatalf("rows %+v", rows)
	}
	if err := syscall.Kill(*rows[0].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	b := c.waitBatch(t, id)
	completedOnce(t, c.client, b, n)
	// The attempt the kill broke went back to the queue, and the batch
	// was finished on a new worker.
	rec, _ := c.queen.logs.wait(t, 0, "job attempt ended", map[string]string{"batch_id": id, "state": "queued", "lifecycle_id": rows[0].ID})
	t.Logf("the attempt on the killed worker: %v", rec.Attrs["err"])
	if rows := c.rows(); len(rows) != 2 {
		t.Errorf("rows after the kill: %+v", rows)
	}
}

// kill -9 of the queen during a batch, then a new queen on the same
// database: the jobs that were running are queued again and every
// request ends exactly once in the output file.
func TestProcessBatchQueenKilled(t *testing.T) {
	eachBackend(t, func(t *testing.T, be backend) {
		dir, url := be.new(t)
		if dir == "" {
			dir = t.TempDir() // the files
		}
		q1, qURL := startQueenProc(t, dir, url, "--data-dir", dir, "--log-level", "debug")
		hive := startHiveProc(t, qURL, "node-1", 300*time.Millisecond)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("hive logs:\n%s", hive.logs.String())
			}
			if err := hive.stop(t, syscall.SIGTERM); err != nil {
				t.Errorf("hive exit: %v", err)
			}
		})
		q1.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "node-1", "to": "healthy"})
		client := oai.NewClient(option.WithBaseURL(qURL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
		const n = 40
		id := newBatch(t, client, n, 16)
		q1.logs.wait(t, 0, "job attempt ended", map[string]string{"batch_id": id, "state": "succeeded"})
		if err := q1.stop(t, syscall.SIGKILL); err == nil {
			t.Fatal("the queen exited 0 on SIGKILL")
		}

		q2, qURL2 := startQueenProc(t, dir, url, "--data-dir", dir, "--addr", strings.TrimPrefix(qURL, "http://"), "--log-level", "debug")
		if qURL2 != qURL {
			t.Fatalf("queen came back on %s, want %s", qURL2, qURL)
		}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("first queen's logs:\n%s", q1.logs.String())
				t.Logf("second queen's logs:\n%s", q2.logs.String())
			}
			if err := q2.stop(t, syscall.SIGTERM); err != nil {
				t.Errorf("queen exit: %v", err)
			}
		})
		q2.logs.wait(t, 0, "batch ended", map[string]string{"batch_id": id})
		b, err := client.Batches.Get(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		completedOnce(t, client, b, n)
		t.Logf("running jobs queued again after the restart: %v", q2.logs.Has("jobs that were running when the queen stopped are queued again", nil))
	})
}

// runApiary runs the apiary binary to its end and returns its stdout.
func runApiary(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return apiaryWith(t, nil, args...)
}

// apiary jobs: submit (with --model overriding body.model), ls, show,
// results; every request's line once, custom_ids intact.
func TestProcessJobsCLI(t *testing.T) {
	c := startCluster(t, nil)
	const n = 10
	file := filepath.Join(t.TempDir(), "in.jsonl")
	if err := os.WriteFile(file, []byte(strings.ReplaceAll(batchFile(n, 2), `"model":"tiny"`, `"model":"not-served"`)), 0o600); err != nil {
		t.Fatal(err)
	}
	// No --endpoint: the lines name their url.
	out, err := runApiary(t, "jobs", "submit", file, "--model", "tiny", "--queen", c.url)
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	if !strings.HasPrefix(id, "batch_") {
		t.Fatalf("submit printed %q", out)
	}
	c.waitBatch(t, id)
	if out, err = runApiary(t, "jobs", "show", id, "--queen", c.url); err != nil || !strings.Contains(out, "status:    completed") ||
		!strings.Contains(out, "progress:  100% (10 of 10 ended: 10 completed, 0 failed") {
		t.Fatalf("show: %q, %v", out, err)
	}
	if out, err = runApiary(t, "jobs", "ls", "--queen", c.url); err != nil || !strings.Contains(out, id+"  completed") {
		t.Fatalf("ls: %q, %v", out, err)
	}
	if out, err = runApiary(t, "jobs", "results", id, "--queen", c.url); err != nil {
		t.Fatal(err)
	}
	var lines []resultLine
	for l := range strings.Lines(out) {
		var r resultLine
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("results line %q: %v", l, err)
		}
		if r.Response == nil || r.Response.StatusCode != http.StatusOK {
			t.Fatalf("results line %q", l)
		}
		lines = append(lines, r)
	}
	onceEach(t, n, lines)
	if _, err := runApiary(t, "jobs", "cancel", id, "--queen", c.url); err == nil || !strings.Contains(err.Error(), "only a batch in progress can be cancelled") {
		t.Fatalf("cancel of an ended batch: %v", err)
	}
}

// A batch of /v1/responses lines: each result is a response object whose
// text is the chat completion's greedy text for the same input.
func TestProcessBatchResponses(t *testing.T) {
	c := startCluster(t, nil)
	const n = 3
	var in strings.Builder
	for i := range n {
		fmt.Fprintf(&in, `{"custom_id":"req-%d","method":"POST","url":"/v1/responses","body":{"model":"tiny","input":"Say hello to the bees.","max_output_tokens":8,"temperature":0}}`+"\n", i)
	}
	f, err := upload(t, c.client, in.String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.client.Batches.New(t.Context(), oai.BatchNewParams{InputFileID: f.ID, Endpoint: oai.BatchNewParamsEndpointV1Responses,
		CompletionWindow: oai.BatchNewParamsCompletionWindow24h})
	if err != nil {
		t.Fatal(err)
	}
	b = c.waitBatch(t, b.ID)
	if b.Status != oai.BatchStatusCompleted || b.RequestCounts.Completed != n || b.ErrorFileID != "" {
		t.Fatalf("ended batch: status %s, counts %+v, errors %+v", b.Status, b.RequestCounts, b.Errors)
	}
	chat, err := c.client.Chat.Completions.New(t.Context(), oai.ChatCompletionNewParams{Model: "tiny", MaxTokens: oai.Int(8), Temperature: oai.Float(0),
		Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("Say hello to the bees.")}})
	if err != nil {
		t.Fatal(err)
	}
	out := results(t, c.client, b.OutputFileID)
	onceEach(t, n, out)
	for _, l := range out {
		var r struct {
			Object, Status string
			Output         []struct {
				Type    string
				Content []struct{ Type, Text string }
			}
			Usage struct {
				OutputTokens int `json:"output_tokens"`
			}
		}
		if l.Response == nil || l.Response.StatusCode != http.StatusOK || json.Unmarshal(l.Response.Body, &r) != nil || r.Object != "response" ||
			r.Status != "incomplete" || len(r.Output) != 1 || len(r.Output[0].Content) != 1 ||
			r.Output[0].Content[0].Text != chat.Choices[0].Message.Content || r.Usage.OutputTokens != 8 {
			t.Fatalf("result line of %s: %+v (%s)", l.CustomID, r, l.Response.Body)
		}
	}
}

// A batch cancelled while queued behind an older one (none of its jobs
// under way: the dispatcher runs one at a time here) is cancelled within
// seconds, while the older batch runs on — before, it stayed cancelling
// until the queen restarted.
func TestProcessBatchCancelledWhileQueuedEnds(t *testing.T) {
	c := startCluster(t, []string{"--batch-concurrency", "1", "--log-level", "debug"})
	ctx := t.Context()
	older := newBatch(t, c.client, 20, 64)
	c.queen.logs.wait(t, 0, "job attempt ended", map[string]string{"batch_id": older, "state": "succeeded"})
	newer := newBatch(t, c.client, 3, 8)
	cancelled := time.Now()
	if _, err := c.client.Batches.Cancel(ctx, newer); err != nil {
		t.Fatal(err)
	}
	for {
		b, err := c.client.Batches.Get(ctx, newer)
		if err != nil {
			t.Fatal(err)
		}
		if b.Status == oai.BatchStatusCancelled {
			if b.RequestCounts.Failed != 3 || b.ErrorFileID == "" {
				t.Errorf("cancelled batch: counts %+v, error file %q", b.RequestCounts, b.ErrorFileID)
			}
			t.Logf("cancelled %s after the cancel", time.Since(cancelled).Round(time.Millisecond))
			break
		}
		if time.Since(cancelled) > 5*time.Second {
			t.Fatalf("the batch is %s 5 s after its cancel; want cancelled", b.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if b, err := c.client.Batches.Get(ctx, older); err != nil || b.Status != oai.BatchStatusInProgress {
		t.Errorf("the older batch: %v %v, want still in progress", b, err)
	}
}
