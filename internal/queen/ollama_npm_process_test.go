//go:build !race

package queen

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/testbin"
)

// npmOllamaVersion is the npm `ollama` release the test runs.
const npmOllamaVersion = "0.6.4"

type ollamaChat struct {
	Model      string
	Message    struct{ Role, Content string }
	Done       bool
	DoneReason string `json:"done_reason"`
	EvalCount  int    `json:"eval_count"`
	PromptEval int    `json:"prompt_eval_count"`
	Total      int64  `json:"total_duration"`
	EvalDur    int64  `json:"eval_duration"`
	PromptDur  int64  `json:"prompt_eval_duration"`
}

type ollamaListed struct {
	Name, Model, Digest string
	Size                int64
	Details             struct {
		Format, Family    string
		ParameterSize     string `json:"parameter_size"`
		QuantizationLevel string `json:"quantization_level"`
	}
}

type ollamaPS struct {
	Models []struct {
		Name, Digest string
		Size         int64
		SizeVRAM     int64     `json:"size_vram"`
		ExpiresAt    time.Time `json:"expires_at"`
	}
}

type ollamaAction struct {
	Model, Response string
	Message         struct{ Content string }
	Done            bool
	DoneReason      string  `json:"done_reason"`
	EvalCount       int     `json:"eval_count"`
	MS              float64 `json:"ms"`
}

// sha256Hex is a digest as Ollama lists it: 64 hex digits.
var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

type ollamaFailure struct {
	Message string
	Status  int
}

// The `ollama` npm client against the queen: every call it makes answers
// in Ollama's shapes, the greedy text is the OpenAI endpoint's, streamed
// and whole alike, the embeddings are /v1/embeddings', and its errors
// read as messages (not "[object Object]").
func TestProcessOllamaNPMClient(t *testing.T) {
	prefix := testbin.NPM(t, "ollama", npmOllamaVersion)
	const token = "api-0123456789abcdef"
	c := startClusterWith(t, clusterOptions{apiToken: token}, nil)
	stdout := runNodeScript(t, "ollama-npm.mjs", "BASE_URL="+c.url, "API_KEY="+token, "MODEL=tiny", "OLLAMA_PREFIX="+prefix)
	var r struct {
		Version string
		List    struct {
			Models []ollamaListed
		}
		Show struct {
			Details      struct{ Format, Family string }
			Capabilities []string
		}
		VersionAPI struct{ Version string } `json:"version_api"`
		Chat       ollamaChat
		Streamed   struct {
			Parts int
			Text  string
			Last  ollamaChat
		}
		PS            ollamaPS `json:"ps"`
		PSAfterUnload ollamaPS `json:"ps_after_unload"`
		PSAfterLoad   ollamaPS `json:"ps_after_load"`
		Unload        ollamaAction
		Load          ollamaAction
		ChatLoad      ollamaAction `json:"chat_load"`
		SchemaFormat  struct {
			Text  string
			Calls []json.RawMessage
			Last  ollamaChat
		} `json:"schema_format"`
		Generate struct {
			Model, Response string
			Done            bool
			EvalCount       int `json:"eval_count"`
		}
		JSONFormat ollamaChat `json:"json_format"`
		Embed      struct {
			Model      string
			Embeddings [][]float64
		}
		Embeddings struct{ Embedding []float64 }
		Missing    ollamaFailure `json:"missing_model"`
		BadOption  ollamaFailure `json:"bad_option"`
		Pull       ollamaFailure
		NoToken    ollamaFailure `json:"no_token"`
	}
	if err := json.Unmarshal(stdout, &r); err != nil {
		t.Fatalf("the script printed %q: %v", string(stdout), err)
	}
	if r.Version != npmOllamaVersion {
		t.Errorf("the script loaded ollama %s, want %s", r.Version, npmOllamaVersion)
	}
	if i := slices.IndexFunc(r.List.Models, func(m ollamaListed) bool { return m.Name == "tiny:latest" }); i < 0 {
		t.Errorf("list: %+v, want tiny:latest", r.List.Models)
	} else if m := r.List.Models[i]; m.Model != "tiny:latest" || m.Size <= 0 || !sha256Hex.MatchString(m.Digest) || m.Details.Format != "gguf" ||
		m.Details.Family != "llama" || m.Details.ParameterSize == "" || m.Details.QuantizationLevel == "" {
		t.Errorf("list: %+v, want tiny:latest with its size, a sha256 digest, gguf, llama, its parameter size and file type", m)
	}
	if r.Show.Details.Family != "llama" || r.VersionAPI.Version == "" {
		t.Errorf("show %+v, version %+v", r.Show, r.VersionAPI)
	}

	// The greedy answer of the OpenAI endpoint, for the same request.
	want := openAIChatText(t, c.url, token)
	if r.Chat.Message.Role != "assistant" || r.Chat.Message.Content != want || !r.Chat.Done || r.Chat.DoneReason != "length" ||
		r.Chat.EvalCount != 8 || r.Chat.PromptEval == 0 || r.Chat.Total <= 0 || r.Chat.Model != "tiny" || r.Chat.EvalDur <= 0 || r.Chat.PromptDur <= 0 ||
		r.Chat.EvalDur+r.Chat.PromptDur > r.Chat.Total {
		t.Errorf("chat: %+v, want %q after 8 tokens (length)", r.Chat, want)
	}
	if r.Streamed.Text != want || r.Streamed.Parts < 3 || !r.Streamed.Last.Done || r.Streamed.Last.DoneReason != "length" || r.Streamed.Last.EvalCount != 8 {
		t.Errorf("streamed chat: %d parts, %q, last %+v; want %q, its last part done after 8 tokens", r.Streamed.Parts, r.Streamed.Text, r.Streamed.Last, want)
	}
	if r.Generate.Response != want || !r.Generate.Done || r.Generate.EvalCount != 8 || r.Generate.Model != "tiny:latest" {
		t.Errorf("generate (as tiny:latest): %+v, want %q", r.Generate, want)
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(r.JSONFormat.Message.Content), &obj); err != nil && r.JSONFormat.DoneReason != "length" {
		t.Errorf("format json: %q is no JSON object (%v)", r.JSONFormat.Message.Content, err)
	}
	if len(r.PS.Models) != 1 || r.PS.Models[0].Name != "tiny:latest" || r.PS.Models[0].Size <= 0 || r.PS.Models[0].SizeVRAM != 0 ||
		!sha256Hex.MatchString(r.PS.Models[0].Digest) || !r.PS.Models[0].ExpiresAt.After(time.Now()) {
		t.Errorf("ps: %+v, want the one CPU worker of tiny, expiring after now", r.PS.Models)
	}

	// A plain schema with tools, streamed: a call, or text that the
	// schema validates.
	if len(r.SchemaFormat.Calls) == 0 {
		var v struct {
			Name  *string
			Count *int
			Note  *string
		}
		dec := json.NewDecoder(strings.NewReader(r.SchemaFormat.Text))
		if err := dec.Decode(&v); err != nil || v.Name == nil || v.Count == nil || len(*v.Name) > 12 || *v.Count < 0 || *v.Count > 99 ||
			(v.Note != nil && len(*v.Note) > 4) || !r.SchemaFormat.Last.Done || r.SchemaFormat.Last.DoneReason != "stop" {
			t.Errorf("chat with tools and a plain schema: %q (%v), last %+v; want an object the schema validates", r.SchemaFormat.Text, err, r.SchemaFormat.Last)
		}
	}

	// Unload and load: done at once, nothing generated; the worker stops
	// (audited with why), and a load brings one back.
	for what, a := range map[string]ollamaAction{"unload": r.Unload, "load": r.Load, "chat load": r.ChatLoad} {
		if !a.Done || a.DoneReason != strings.Fields(what)[len(strings.Fields(what))-1] || a.Response != "" || a.EvalCount != 0 || a.Model != "tiny" {
			t.Errorf("%s: %+v", what, a)
		}
		t.Logf("%s answered in %.1f ms", what, a.MS)
	}
	if len(r.PSAfterUnload.Models) != 0 || len(r.PSAfterLoad.Models) != 1 {
		t.Errorf("ps after the unload %+v, after the load %+v; want none, then one", r.PSAfterUnload.Models, r.PSAfterLoad.Models)
	}
	stopped := 0
	for _, row := range c.rows() {
		if row.Status == "STOPPED" && strings.Contains(row.Reason, "keep_alive 0") {
			stopped++
		}
	}
	if stopped != 1 {
		t.Errorf("%d rows stopped by the unload, want 1: %+v", stopped, c.rows())
	}

	vecs := openAIEmbeddings(t, c.url, token, []string{"a bee", "a wasp"})
	if len(r.Embed.Embeddings) != 2 || !slices.Equal(r.Embed.Embeddings[0], vecs[0]) || !slices.Equal(r.Embed.Embeddings[1], vecs[1]) {
		t.Errorf("embed: %d vectors, not /v1/embeddings' two", len(r.Embed.Embeddings))
	}
	if !slices.Equal(r.Embeddings.Embedding, vecs[0]) {
		t.Errorf("embeddings (legacy): not /v1/embeddings' vector")
	}

	for _, f := range []struct {
		what   string
		got    ollamaFailure
		status int
		msg    string
	}{
		{"a model nobody has", r.Missing, http.StatusNotFound, `model "no-such-model"`},
		{"a misspelt option", r.BadOption, http.StatusBadRequest, "options.temprature is not an Ollama option"},
		{"pull", r.Pull, http.StatusNotFound, "apiary models pull"},
		{"no token", r.NoToken, http.StatusUnauthorized, "APIARY_API_TOKEN"},
	} {
		if f.got.Status != f.status || !strings.Contains(f.got.Message, f.msg) {
			t.Errorf("%s: %+v, want %d and %q", f.what, f.got, f.status, f.msg)
		}
	}
}

func openAIChatText(t *testing.T, base, token string) string {
	t.Helper()
	var a struct {
		Choices []struct{ Message struct{ Content string } }
	}
	postJSON(t, base+"/v1/chat/completions", token, `{"model":"tiny","messages":[{"role":"user","content":"Say hello to the bees."}],"max_tokens":8,"temperature":0}`, &a)
	if len(a.Choices) != 1 {
		t.Fatalf("chat completion: %+v", a)
	}
	return a.Choices[0].Message.Content
}

func openAIEmbeddings(t *testing.T, base, token string, input []string) [][]float64 {
	t.Helper()
	in, _ := json.Marshal(input)
	var a struct {
		Data []struct{ Embedding []float64 }
	}
	postJSON(t, base+"/v1/embeddings", token, `{"model":"tiny","input":`+string(in)+`}`, &a)
	out := make([][]float64, len(a.Data))
	for i, d := range a.Data {
		out[i] = d.Embedding
	}
	return out
}

func postJSON(t *testing.T, url, token, body string, v any) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b := new(bytes.Buffer)
		b.ReadFrom(resp.Body)
		t.Fatalf("POST %s: %s %s", url, resp.Status, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

// runNodeScript runs testdata/script under node with env added to this
// process's environment, bounded by 3 × waitLimit, and returns what it
// printed on stdout; a failed run fails the test with its stderr.
func runNodeScript(t *testing.T, script string, env ...string) []byte {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("this test runs an npm client with node (scripts/deps.sh installs it): %v", err)
	}
	path, err := filepath.Abs(filepath.Join("testdata", script))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*waitLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, path)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node %s: %v\nstderr:\n%s", path, err, stderr.String())
	}
	return stdout.Bytes()
}
