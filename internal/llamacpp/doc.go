// Package llamacpp implements engine.Engine in-process on llama.cpp's C API.
//
// The llama.cpp and ggml sources are compiled from the pinned Go module
// github.com/ollama/ollama (its llama package pulls them in); this package
// talks to llama.h directly so that batching, sampling and detokenization run
// without extra copies or Go-side work per token.
package llamacpp

import (
	// Compiles and links llama.cpp, ggml and the CPU backend.
	_ "github.com/ollama/ollama/llama"
)
