//go:build !race

package queen

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/apiary-llm/apiary/internal/testmodel"
)

// restoreRe reads the worker's "KV cache restored" log line.
var restoreRe = regexp.MustCompile(`KV cache restored.*?bytes"?[=:](\d+).*?restore_ms"?[=:](\d+)`)

// The KV cache survives a swap. One worker at a time (--max-loaded 1): a
// conversation on tiny, a request for b (tiny's worker evicted: it saves
// its slot's KV under the hive's data dir), tiny's next turn (a new
// worker restores the save before it serves): at least 80 % of that
// turn's prompt comes from the restored cache, and its greedy answer is
// the one of a worker that never saved or restored anything.
// The cached tokens are what the answer's usage reports
// (prompt_tokens_details.cached_tokens).
func TestProcessKVCacheSurvivesASwap(t *testing.T) {
	shape := testmodel.Options{Dim: 128, Heads: 4, Layers: 2, FF: 256, Vocab: 2000}
	other := shape
	other.Seed = 2
	c := startClusterWith(t, clusterOptions{model: shape, more: map[string]testmodel.Options{"b": other}},
		[]string{"--min-residency", "0"}, "--max-loaded", "1", "--worker-ctx-size", "2048")

	system := oai.SystemMessage(strings.Repeat("You keep bees. Hives hold a queen, workers and drones; "+
		"the workers gather nectar, make honey and wax, and guard the entrance. ", 12))
	turn1 := []oai.ChatCompletionMessageParamUnion{system, oai.UserMessage("When do bees swarm?")}
	var reused, promptTokens int // of the last chat
	chat := func(client oai.Client, model string, msgs []oai.ChatCompletionMessageParamUnion) string {
		t.Helper()
		out, err := client.Chat.Completions.New(t.Context(), oai.ChatCompletionNewParams{Model: model, MaxTokens: oai.Int(8),
			Temperature: oai.Float(0), Messages: msgs})
		if err != nil {
			t.Fatalf("chat with %s: %v", model, err)
		}
		reused, promptTokens = int(out.Usage.PromptTokensDetails.CachedTokens), int(out.Usage.PromptTokens)
		return out.Choices[0].Message.Content
	}
	answer1 := chat(c.client, "tiny", turn1)
	chat(c.client, "b", []oai.ChatCompletionMessageParamUnion{oai.UserMessage("Say hello to the bees.")})
	turn2 := append(turn1, oai.AssistantMessage(answer1), oai.UserMessage("And in autumn?"))
	answer2 := chat(c.client, "tiny", turn2)

	// The second tiny worker's log: restored.
	logs, _ := filepath.Glob(filepath.Join(c.dir, "hive", "logs", "*.log"))
	var restored int
	var restoreBytes, restoreMS string
	for _, f := range logs {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "KV cache restored") {
			continue
		}
		restored++
		if m := restoreRe.FindStringSubmatch(string(b)); m != nil {
			restoreBytes, restoreMS = m[1], m[2]
		}
	}
	if restored != 1 {
		t.Fatalf("%d workers restored a KV cache, want 1 (tiny's second)", restored)
	}
	if promptTokens == 0 || reused*5 < promptTokens*4 {
		t.Fatalf("turn 2 reused %d of its %d prompt tokens, want at least 80 %%", reused, promptTokens)
	}
	t.Logf("turn 2 after the swap: %d of %d prompt tokens from the restored cache (%.0f %%)",
		reused, promptTokens, 100*float64(reused)/float64(promptTokens))

	// A worker that never saved or restored: the same greedy answer.
	w := startProc(t, "worker", nil, "worker", "--model", filepath.Join(c.dir, "models", "tiny.gguf"),
		"--port", "0", "--threads", "1", "--ctx-size", "2048")
	w.logs.wait(t, 0, "serving", nil)
	lrec, _ := w.logs.wait(t, 0, "listening", nil)
	fresh := oai.NewClient(option.WithBaseURL("http://"+lrec.Attrs["addr"]+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	start := time.Now()
	got := chat(fresh, "tiny", turn2)
	t.Logf("a fresh worker answered turn 2 (whole prompt decoded) in %d ms; the restore took %s ms for %s bytes",
		time.Since(start).Milliseconds(), restoreMS, restoreBytes)
	if answer2 == "" {
		t.Fatal("turn 2's answer is empty: nothing to compare")
	}
	if got != answer2 {
		t.Fatalf("turn 2's greedy answer after a restore %q, a fresh worker's %q", answer2, got)
	}
}
