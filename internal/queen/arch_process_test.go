//go:build !race

package queen

import (
	"testing"

	oai "github.com/openai/openai-go"

	"github.com/apiary-llm/apiary/internal/testmodel"
)

// Every architecture `apiary models testmodel --arch` writes serves a chat
// completion through queen, hive and worker: the hive accepts it, the
// queen places a worker of it, and the answer comes back streamed whole.
func TestProcessEveryArchitectureServesAChat(t *testing.T) {
	more := map[string]testmodel.Options{}
	for _, a := range testmodel.Archs() {
		more["arch-"+string(a)] = testmodel.Options{Arch: a}
	}
	c := startClusterWith(t, clusterOptions{more: more}, []string{"--max-workers", "1"})
	for _, a := range testmodel.Archs() {
		t.Run(string(a), func(t *testing.T) {
			got, err := c.client.Chat.Completions.New(t.Context(), oai.ChatCompletionNewParams{
				Model:     "arch-" + string(a),
				Messages:  []oai.ChatCompletionMessageParamUnion{oai.UserMessage("Hello, who are you?")},
				MaxTokens: oai.Int(8), Temperature: oai.Float(0),
			}, ignoreEOS)
			if err != nil || len(got.Choices) != 1 || got.Usage.CompletionTokens != 8 || got.Model == "" {
				t.Fatalf("chat with %s: %+v %v", a, got, err)
			}
		})
	}
}
