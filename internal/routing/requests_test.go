package routing

import (
	"strings"
	"testing"
	"time"
)

// A whole answer's usage and llama-server's timings are read from its
// last bytes, however long it is; the time to first token is the answer's
// end less the worker's generation time, tok/s the worker's own.
func TestFinishedReadsTheAnswersTail(t *testing.T) {
	body := `{"id":"x","choices":[{"text":"` + strings.Repeat("a", 10*tailSize) + `"}],` +
		`"usage":{"prompt_tokens":18,"completion_tokens":8,"total_tokens":26,"prompt_tokens_details":{"cached_tokens":16}},` +
		`"timings":{"prompt_n":18,"prompt_ms":5,"predicted_n":8,"predicted_ms":100,"predicted_per_second":80}}`
	tw := &tailWriter{buf: make([]byte, 0, 2*tailSize)}
	for i := 0; i < len(body); i += 1000 {
		_, _ = tw.Write([]byte(body[i:min(i+1000, len(body))]))
		if len(tw.buf) > 2*tailSize {
			t.Fatalf("the tail holds %d bytes; at most %d", len(tw.buf), 2*tailSize)
		}
	}
	start := time.Unix(1000, 0)
	st := reqStats{worker: "wk-1", end: start.Add(time.Second)}
	st.readTail(tw.buf)
	f := st.finished(start, "completions", "tiny", false, 200)
	if f.PromptTokens == nil || *f.PromptTokens != 18 || f.CompletionTokens == nil || *f.CompletionTokens != 8 || f.CachedTokens == nil || *f.CachedTokens != 16 {
		t.Fatalf("tokens %v %v %v; want 18, 8, 16 cached", f.PromptTokens, f.CompletionTokens, f.CachedTokens)
	}
	if f.TokensPerSecond == nil || *f.TokensPerSecond != 80 || f.TTFT == nil || *f.TTFT != 900*time.Millisecond || f.Duration != time.Second {
		t.Fatalf("tok/s %v, ttft %v, duration %s; want 80, 900ms, 1s", f.TokensPerSecond, f.TTFT, f.Duration)
	}

	// A stream without usage: its events over the time they took.
	var s reqStats
	for i := range 5 {
		s.streamEvent([]byte(`data: {"choices":[{"text":"a"}]}`+"\n\n"), start.Add(time.Duration(i+1)*100*time.Millisecond))
	}
	f = s.finished(start, "completions", "tiny", true, 200)
	if f.CompletionTokens != nil || f.CachedTokens != nil || f.TTFT == nil || *f.TTFT != 100*time.Millisecond || f.TokensPerSecond == nil || *f.TokensPerSecond != 10 {
		t.Fatalf("stream: completion %v, cached %v, ttft %v, tok/s %v; want none, none, 100ms, 10", f.CompletionTokens, f.CachedTokens, f.TTFT, f.TokensPerSecond)
	}
}
