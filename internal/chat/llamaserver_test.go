package chat_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/apiary-llm/apiary/internal/chat"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// TestTemplatesRenderAsLlamaServerDoes renders each family's template
// with each conversation here and in llama.cpp's own server (the
// llama-server `make test` builds, started with --jinja and the template
// file, asked through /apply-template), and compares them byte for byte
// after the one difference that is llama.cpp's choice, not a template
// engine's: llama-server drops a leading BOS text (it adds the BOS token
// when it tokenizes; the worker's tokenizer keeps one BOS when the text
// starts with it, so the tokens agree). (llama.cpp before v0.5.0 also
// rendered Llama 3.x with tools_in_user_message set false; v0.5.0 leaves
// the template's default, as the worker and Hugging Face's
// apply_chat_template do.)
func TestTemplatesRenderAsLlamaServerDoes(t *testing.T) {
	server := testbin.LlamaServer(t)
	model := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := testmodel.WriteFile(model, testmodel.Options{}); err != nil {
		t.Fatal(err)
	}
	c := loadCases(t)
	tools := toolsOf(t, c.Tools)
	// The messages as the file has them, for llama-server.
	var raw struct {
		Cases map[string]struct {
			Messages json.RawMessage `json:"messages"`
		} `json:"cases"`
	}
	data, err := os.ReadFile("testdata/cases.json")
	if err != nil || json.Unmarshal(data, &raw) != nil {
		t.Fatalf("testdata/cases.json: %v", err)
	}
	templates, _ := filepath.Glob("testdata/*.jinja")
	if len(templates) < 3 {
		t.Fatalf("want the templates in testdata, found %v", templates)
	}
	for _, path := range templates {
		name := strings.TrimSuffix(filepath.Base(path), ".jinja")
		t.Run(name, func(t *testing.T) {
			src, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			tmpl, err := chat.Compile(string(src), "<s>", "</s>")
			if err != nil {
				t.Fatal(err)
			}
			base := testbin.StartLlamaServer(t, server, "-m", model, "--jinja", "--chat-template-file", path, "-c", "256", "-t", "1")
			for cname, cs := range c.Cases {
				body := map[string]any{"messages": raw.Cases[cname].Messages}
				in := chat.Input{AddGenerationPrompt: true}
				if cs.Tools {
					body["tools"] = c.Tools
					in.Tools = tools
				}
				for _, m := range cs.Messages {
					msg := chat.Message{Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID}
					for _, tc := range m.ToolCalls {
						msg.ToolCalls = append(msg.ToolCalls, chat.ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
					}
					in.Messages = append(in.Messages, msg)
				}
				want := applyTemplate(t, base, body)
				in.Now = time.Now()
				got, err := tmpl.Render(in)
				if err != nil {
					t.Fatalf("%s: %v", cname, err)
				}
				got = strings.TrimPrefix(got, "<s>")
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("%s: rendering (-llama-server +ours):\n%s", cname, diff)
				}
			}
		})
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// applyTemplate asks llama-server to render body's conversation.
func applyTemplate(t *testing.T, base string, body map[string]any) string {
	t.Helper()
	resp, err := http.Post(base+"/apply-template", "application/json", bytes.NewReader(mustJSON(t, body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		Prompt *string `json:"prompt"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != http.StatusOK || r.Prompt == nil {
		t.Fatalf("/apply-template: %d, %v", resp.StatusCode, err)
	}
	return *r.Prompt
}
