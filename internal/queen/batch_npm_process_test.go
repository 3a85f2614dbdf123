//go:build !race

package queen

// The Batch API driven by the official npm `openai` client under node,
// against the real queen, hive and worker.

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	oai "github.com/openai/openai-go"

	"github.com/apiary-llm/apiary/internal/testbin"
)

// npmOpenAIVersion is the npm `openai` release the test runs: the newest
// 6.x. 7.x needs node 22 or later, newer than Debian 12's (18) and this
// project's machines' (20).
const npmOpenAIVersion = "6.49.0"

// npmBatchRun is what testdata/openai-npm-batch.mjs prints.
type npmBatchRun struct {
	ClientVersion string `json:"client_version"`
	NodeVersion   string `json:"node_version"`
	File          struct {
		ID, Purpose, Filename string
		Bytes                 int
	}
	Created, Completed, Cancelled npmBatch
	Output, Errors                []resultLine
	Malformed                     struct {
		Refused bool
		Status  int
		Message string
	}
	CancelAnswer    string       `json:"cancel_answer"`
	CancelledOutput []resultLine `json:"cancelled_output"`
	CancelledErrors []resultLine `json:"cancelled_errors"`
	Listed          []string
}

type npmBatch struct {
	ID            string
	Status        string
	RequestCounts struct{ Total, Completed, Failed int } `json:"request_counts"`
	OutputFileID  *string                                `json:"output_file_id"`
	ErrorFileID   *string                                `json:"error_file_id"`
	Metadata      map[string]string
}

// The npm client uploads a batch of 20 chat requests, creates the batch,
// polls it to completed and downloads one result line a request; a
// malformed upload is refused with its line number; a second batch is
// cancelled once its first request has completed and ends cancelled
// with every custom_id once in its two files; the batch list pages one
// batch at a time.
func TestProcessBatchNPMClient(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("this test runs the npm openai client with node (scripts/deps.sh installs it): %v", err)
	}
	prefix := testbin.NPM(t, "openai", npmOpenAIVersion)
	script, err := filepath.Abs(filepath.Join("testdata", "openai-npm-batch.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, []string{"--max-workers", "2"})
	const n = 20

	ctx, cancel := context.WithTimeout(t.Context(), 3*waitLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Env = append(os.Environ(), "OPENAI_BASE_URL="+c.url+"/v1", "OPENAI_API_KEY=unused", "APIARY_NPM_PREFIX="+prefix,
		"BATCH_N="+strconv.Itoa(n), "POLL_MS=20")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node %s: %v\nstderr:\n%s", script, err, stderr.String())
	}
	var run npmBatchRun
	if err := json.Unmarshal(stdout.Bytes(), &run); err != nil {
		t.Fatalf("the script printed %q: %v", stdout.String(), err)
	}
	t.Logf("npm openai %s on node %s", run.ClientVersion, run.NodeVersion)
	if run.ClientVersion != npmOpenAIVersion {
		t.Errorf("the script loaded openai %s, want %s", run.ClientVersion, npmOpenAIVersion)
	}

	// Upload → create → poll → download.
	if !strings.HasPrefix(run.File.ID, "file-") || run.File.Purpose != "batch" || run.File.Filename != "batch.jsonl" || run.File.Bytes == 0 {
		t.Errorf("uploaded file: %+v", run.File)
	}
	if run.Created.Status != "in_progress" || run.Created.RequestCounts.Total != n || run.Created.Metadata["client"] != "npm openai" {
		t.Errorf("created batch: %+v", run.Created)
	}
	done := run.Completed
	if done.Status != "completed" || done.RequestCounts.Completed != n || done.RequestCounts.Failed != 0 || done.OutputFileID == nil ||
		done.ErrorFileID != nil || len(run.Errors) != 0 {
		t.Fatalf("ended batch: %+v, error lines %+v", done, run.Errors)
	}
	onceEach(t, n, run.Output)
	for _, l := range run.Output {
		var body oai.ChatCompletion
		if l.Response == nil || l.Response.StatusCode != http.StatusOK || json.Unmarshal(l.Response.Body, &body) != nil ||
			len(body.Choices) != 1 || body.Usage.CompletionTokens != 2 {
			t.Fatalf("result line of %s: %+v", l.CustomID, l)
		}
	}

	// The malformed upload.
	if m := run.Malformed; !m.Refused || m.Status != http.StatusBadRequest || !strings.Contains(m.Message, "line 3: body.messages") {
		t.Errorf("malformed upload: %+v", m)
	}

	// The cancel.
	if run.CancelAnswer != "cancelling" && run.CancelAnswer != "cancelled" {
		t.Errorf("cancel answered %q", run.CancelAnswer)
	}
	cb := run.Cancelled
	if cb.Status != "cancelled" || cb.RequestCounts.Completed == 0 || cb.RequestCounts.Failed == 0 ||
		cb.RequestCounts.Completed+cb.RequestCounts.Failed != 100 || len(run.CancelledOutput) != cb.RequestCounts.Completed {
		t.Fatalf("cancelled batch: %+v, %d output lines", cb, len(run.CancelledOutput))
	}
	onceEach(t, 100, run.CancelledOutput, run.CancelledErrors)
	for _, l := range run.CancelledErrors {
		if l.Error == nil || l.Error.Code != "batch_cancelled" {
			t.Fatalf("error line of the cancelled batch: %+v", l)
		}
	}

	// The list, one batch a page, newest first.
	if want := []string{cb.ID, done.ID}; !slices.Equal(run.Listed, want) {
		t.Errorf("listed %v, want %v", run.Listed, want)
	}
}
