package queen

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/apiary-llm/apiary/internal/testbin"
)

// TestProcessExternalEngine runs a real queen with a model config whose
// model names engine fake, and a real hive whose --engines file declares
// it as the scripted fake engine: a chat request through the queen is
// placed on that hive, started as the engine, and answered by it with the
// body relayed and no bearer; a SIGKILL of the engine makes its row
// FAILED.
func TestProcessExternalEngine(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "models.yaml")
	writeConfig(t, cfg, "models:\n  fakechat:\n    file: tiny\n    engine: fake\n")
	engines := filepath.Join(dir, "engines.yaml")
	writeConfig(t, engines, "engines:\n  fake:\n    command: ["+strconv.Quote(testbin.FakeEngine(t))+
		", -host, '{host}', -port, '{port}', -model, '{model}']\n    health: /health\n")
	c := startCluster(t, []string{"--config", cfg}, "--engines", engines)

	body := `{"model":"fakechat","messages":[{"role":"user","content":"hi"}]}`
	resp, err := http.Post(c.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var answer struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
		ReceivedBody string `json:"received_body"`
		ReceivedAuth string `json:"received_authorization"`
	}
	err = json.NewDecoder(resp.Body).Decode(&answer)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("chat: %d %v", resp.StatusCode, err)
	}
	if len(answer.Choices) != 1 || answer.Choices[0].Message.Content != "fake engine answer" {
		t.Errorf("answer = %+v", answer)
	}
	// The queen names the model file to the engine, as to any worker; the
	// rest of the body is the client's.
	var got, want any
	if err := json.Unmarshal([]byte(answer.ReceivedBody), &got); err != nil {
		t.Fatalf("the engine received %q: %v", answer.ReceivedBody, err)
	}
	_ = json.Unmarshal([]byte(`{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`), &want)
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("the engine received %s (-want +got):\n%s", answer.ReceivedBody, d)
	}
	if answer.ReceivedAuth != "" {
		t.Errorf("the engine received a bearer: %q", answer.ReceivedAuth)
	}

	placed, _ := c.queen.logs.wait(t, 0, "worker placed on demand", map[string]string{"model_ref": "tiny"})
	id := placed.Attrs["lifecycle_id"]
	spawned, _ := c.hive.logs.wait(t, 0, "worker spawned", map[string]string{"engine": "fake"})
	pid, err := strconv.Atoi(spawned.Attrs["pid"])
	if err != nil {
		t.Fatalf("spawn record without a pid: %v", spawned)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	rec, _ := c.queen.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": id, "to": "FAILED"})
	if !strings.Contains(rec.Attrs["reason"], "killed by signal 9") {
		t.Errorf("FAILED reason = %q", rec.Attrs["reason"])
	}
}
