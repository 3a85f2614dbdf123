// Package benchmark measures apiary's worker against llama.cpp's own
// llama-server, side by side on one machine, one GGUF, the same threads and
// sampling settings, through their OpenAI-compatible HTTP APIs.
//
// Two figures are compared, each per round on both servers, in alternating
// order (A then B, then B then A, …) so that drift of the machine — other
// processes, thermal state — falls on both sides alike:
//
//   - generation: a streamed POST /v1/completions of GenTokens tokens
//     (temperature 0, ignore_eos). Tokens per second from the first chunk
//     that carries text to the last chunk: (completion_tokens − 1) over that
//     interval, so prompt processing and connection set-up are left out.
//   - prompt processing: a prompt of PromptTokens tokens with max_tokens 1.
//     Tokens per second = prompt_tokens over the time from sending the
//     request to its first chunk. Every round uses a new prompt, so no
//     prompt cache can help either side.
//
// The report gives the medians of each side and the median of the paired
// ratios B/A (per round), the figure that is least disturbed by drift.
//
// The benchmark itself, BenchmarkLlamaServer, is behind the build tag
// llamaserver: it needs a llama-server build and a model that
// scripts/bench-llama-server.sh provides, so `go test ./...` does not run
// it. Run the script instead.
package benchmark
