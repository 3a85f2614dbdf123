package worker

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// post sends body to url+path and decodes the JSON answer into out.
func postTo(t *testing.T, url, path, body string, out any) {
	t.Helper()
	res, err := http.Post(url+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("%s: status %d", path, res.StatusCode)
	}
	if err := json.NewDecoder(res.Body).Decode(out); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

type cachedAnswer struct {
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails struct {
			CachedTokens *int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Timings struct {
		CacheN  int `json:"cache_n"`
		PromptN int `json:"prompt_n"`
	} `json:"timings"`
}

// A request that shares a long prefix with the one before finds it in
// the worker's slot: its usage says how many prompt tokens were cached
// (OpenAI's field, the stream's usage chunk, Anthropic's
// cache_read_input_tokens, the timings' cache_n), and its greedy output
// is what a cold worker answers.
func TestBinaryUsageReportsCachedPrefix(t *testing.T) {
	_, url := startWorkerBinary(t, nil, "--slots", "2", "--ctx-size", "2048")
	system := strings.Repeat("You keep bees and answer questions about hives, queens and honey. ", 8)
	chat := func(user string, extra string) string {
		return `{"model":"tiny","max_tokens":12,"temperature":0` + extra + `,"messages":[{"role":"system","content":"` + system + `"},{"role":"user","content":"` + user + `"}]}`
	}
	var first cachedAnswer
	postTo(t, url, "/v1/chat/completions", chat("How do hives swarm?", ""), &first)
	if c := first.Usage.PromptTokensDetails.CachedTokens; c == nil || *c != 0 {
		t.Errorf("first request: cached_tokens %v, want 0", c)
	}
	var second cachedAnswer
	postTo(t, url, "/v1/chat/completions", chat("What do drones eat?", ""), &second)
	c := second.Usage.PromptTokensDetails.CachedTokens
	if c == nil || *c < second.Usage.PromptTokens/2 || *c >= second.Usage.PromptTokens {
		t.Fatalf("second request: cached_tokens %v of %d prompt tokens, want most of them (the system prompt)", c, second.Usage.PromptTokens)
	}
	if second.Timings.CacheN != *c || second.Timings.PromptN != second.Usage.PromptTokens-*c {
		t.Errorf("timings cache_n %d prompt_n %d, want %d and %d", second.Timings.CacheN, second.Timings.PromptN, *c, second.Usage.PromptTokens-*c)
	}

	_, coldURL := startWorkerBinary(t, nil, "--slots", "2", "--ctx-size", "2048")
	var cold cachedAnswer
	postTo(t, coldURL, "/v1/chat/completions", chat("What do drones eat?", ""), &cold)
	if cold.Choices[0].Message.Content != second.Choices[0].Message.Content {
		t.Errorf("greedy output with the prefix cached %q, cold %q", second.Choices[0].Message.Content, cold.Choices[0].Message.Content)
	}

	// The stream's usage chunk.
	res, err := http.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(chat("Where do bees sleep?", `,"stream":true,"stream_options":{"include_usage":true}`)))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var streamed *int
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ch cachedAnswer
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatal(err)
		}
		if ch.Usage.PromptTokens > 0 {
			streamed = ch.Usage.PromptTokensDetails.CachedTokens
		}
	}
	if streamed == nil || *streamed < second.Usage.PromptTokens/2 {
		t.Errorf("stream's usage chunk: cached_tokens %v, want the system prompt's", streamed)
	}

	// Anthropic's shape: input_tokens counts the tokens not read from the cache.
	var msg struct {
		Usage struct {
			InputTokens          int `json:"input_tokens"`
			CacheReadInputTokens int `json:"cache_read_input_tokens"`
		} `json:"usage"`
	}
	postTo(t, url, "/v1/messages", `{"model":"tiny","max_tokens":8,"system":"`+system+`","messages":[{"role":"user","content":"Is honey sweet?"}]}`, &msg)
	if msg.Usage.CacheReadInputTokens < msg.Usage.InputTokens {
		t.Errorf("messages usage %+v: want most input read from the cache", msg.Usage)
	}
}
