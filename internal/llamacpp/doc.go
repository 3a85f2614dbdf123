// Package llamacpp implements engine.Engine in-process on llama.cpp's C API.
//
// llama.cpp and ggml are shared libraries built from a pinned source by
// scripts/llamacpp.sh (`make build` puts them beside bin/apiary); this
// package talks to llama.h directly so that batching, sampling and
// detokenization run without extra copies or Go-side work per token.
package llamacpp
