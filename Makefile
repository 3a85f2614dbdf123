# apiary build. `make build` puts the binary at bin/apiary (and its x86-64-v3 and x86-64-v4 builds
# beside it, see below); `make test`
# runs every test. The llama.cpp sources come from the pinned Go module
# github.com/ollama/ollama; Go strips their vendor/ directory, so the build
# adds Debian's nlohmann-json3-dev and libstb-dev and a stub miniaudio header
# (audio input only). The stub is copied to a fixed place outside the tree so
# that every clone shares one cgo build cache (a cold llama.cpp build takes
# minutes; a cached one seconds).

SHELL := /bin/bash
GO ?= go
OLLAMA_MOD := github.com/ollama/ollama
CGO_INCLUDE := $(HOME)/.cache/apiary/include
OLLAMA_DIR = $(shell $(GO) list -m -f '{{.Dir}}' $(OLLAMA_MOD) 2>/dev/null)

# llama.cpp's kernels are chosen at compile time. On amd64 `make build` links
# three binaries from one source: $(BIN)/apiary, portable (x86-64 baseline;
# the entry point on every machine), $(BIN)/apiary-x86-64-v3 (AVX2, FMA,
# F16C: several times faster) and $(BIN)/apiary-x86-64-v4 (AVX-512 with
# VNNI); workers run the best one the CPU has (see internal/cpuvariant).
# All are -O3 -DNDEBUG, as llama.cpp's own Release build: the package's cgo
# directives alone leave -O2 with asserts on.
OPT_FLAGS := -O3 -DNDEBUG
V3_FLAGS := $(OPT_FLAGS) -march=x86-64-v3
V4_FLAGS := $(OPT_FLAGS) -march=x86-64-v4 -mavx512vnni
GOARCH_HOST := $(shell $(GO) env GOARCH)
VARIANT_VAR := github.com/apiary-llm/apiary/internal/cpuvariant.Name
BIN ?= bin

# Tests compile llama.cpp into their own binaries and run them here: they use
# the v3 flags when this machine has AVX2 (sharing the v3 build's cache).
HAS_AVX2 := $(shell grep -qw avx2 /proc/cpuinfo 2>/dev/null && echo yes)
ifeq ($(HAS_AVX2),yes)
TEST_CGO_FLAGS := $(V3_FLAGS)
else
TEST_CGO_FLAGS := $(OPT_FLAGS)
endif

export CGO_ENABLED := 1
export CGO_CFLAGS := $(TEST_CGO_FLAGS)
export CGO_CXXFLAGS := $(TEST_CGO_FLAGS)
export CGO_CPPFLAGS = -I$(CGO_INCLUDE) -I$(OLLAMA_DIR)/llama/llama.cpp/include -I$(OLLAMA_DIR)/ml/backend/ggml/ggml/include

TEST_FLAGS ?= -count=1 -timeout 60m

.PHONY: all build cuda deps cgo-include lint llama-server test demo bench bench-worker clean

all: build

# deps installs what the build needs on Debian 12 (skipped when present).
deps:
	@./scripts/deps.sh

cgo-include:
	@mkdir -p $(CGO_INCLUDE)/miniaudio
	@cmp -s cgo/include/miniaudio/miniaudio.h $(CGO_INCLUDE)/miniaudio/miniaudio.h || \
		cp cgo/include/miniaudio/miniaudio.h $(CGO_INCLUDE)/miniaudio/miniaudio.h
	@$(GO) mod download $(OLLAMA_MOD)

build: cgo-include
ifeq ($(GOARCH_HOST),amd64)
	CGO_CFLAGS="$(OPT_FLAGS)" CGO_CXXFLAGS="$(OPT_FLAGS)" \
		$(GO) build -ldflags "-X $(VARIANT_VAR)=portable" -o $(BIN)/apiary ./cmd/apiary
	CGO_CFLAGS="$(V3_FLAGS)" CGO_CXXFLAGS="$(V3_FLAGS)" \
		$(GO) build -ldflags "-X $(VARIANT_VAR)=x86-64-v3" -o $(BIN)/apiary-x86-64-v3 ./cmd/apiary
	CGO_CFLAGS="$(V4_FLAGS)" CGO_CXXFLAGS="$(V4_FLAGS)" \
		$(GO) build -ldflags "-X $(VARIANT_VAR)=x86-64-v4" -o $(BIN)/apiary-x86-64-v4 ./cmd/apiary
else
	CGO_CFLAGS="$(OPT_FLAGS)" CGO_CXXFLAGS="$(OPT_FLAGS)" $(GO) build -o $(BIN)/apiary ./cmd/apiary
endif

# llama.cpp's CUDA backend, bin/libggml-cuda.so, from the same vendored
# ggml sources (CMake and nvcc; see docs/gpu.md). Workers load it at run
# time; without it a node's GPUs are reported unusable.
cuda: cgo-include
	@./scripts/gpu-proof.sh cuda

# Packages free of cgo also run under the race detector (the llama.cpp
# packages would need a second cold C++ build for it).
RACE_PKGS = $(shell $(GO) list -f '{{if not .CgoFiles}}{{$$cgo := false}}{{range .Deps}}{{if eq . "$(OLLAMA_MOD)/llama"}}{{$$cgo = true}}{{end}}{{end}}{{if not $$cgo}}{{.ImportPath}}{{end}}{{end}}' ./...)

# go vet and staticcheck (pinned in go.mod as a tool), both clean.
lint: cgo-include
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

# llama.cpp's llama-server, which the external-engine tests run: built
# alone, CPU only, once per version into the user's cache
# (scripts/bench-llama-server.sh server; internal/testbin.LlamaServer).
llama-server: deps
	@./scripts/bench-llama-server.sh server >/dev/null

test: deps build lint llama-server
	APIARY_BIN=$(abspath $(BIN))/apiary $(GO) test $(TEST_FLAGS) ./...
	APIARY_BIN=$(abspath $(BIN))/apiary $(GO) test -race $(TEST_FLAGS) $(RACE_PKGS)

demo: deps build
	@./scripts/demo.sh

bench: deps build
	APIARY_BIN=$(abspath $(BIN))/apiary $(GO) test -run '^$$' -bench . -benchtime 3x ./...

# Generation speed through the worker's HTTP API vs the engine in-process.
bench-worker: deps build
	APIARY_BIN=$(abspath $(BIN))/apiary $(GO) test -run '^$$' -bench WorkerHTTPvsInProcess -benchtime 8x -timeout 30m ./internal/llamacpp/

clean:
	rm -rf bin
