# apiary build. `make build` puts the single binary at bin/apiary; `make test`
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

# -march=x86-64-v3 (AVX2, FMA, F16C) roughly doubles CPU inference speed; use
# it only when the build machine has AVX2, portable code otherwise.
HAS_AVX2 := $(shell grep -qw avx2 /proc/cpuinfo 2>/dev/null && echo yes)
ifeq ($(HAS_AVX2),yes)
ARCH_FLAGS := -march=x86-64-v3
endif

export CGO_ENABLED := 1
export CGO_CFLAGS := -O2 $(ARCH_FLAGS)
export CGO_CXXFLAGS := -O2 $(ARCH_FLAGS)
export CGO_CPPFLAGS = -I$(CGO_INCLUDE) -I$(OLLAMA_DIR)/llama/llama.cpp/include -I$(OLLAMA_DIR)/ml/backend/ggml/ggml/include

TEST_FLAGS ?= -count=1 -timeout 60m

.PHONY: all build deps cgo-include test demo bench bench-worker clean

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
	$(GO) build -o bin/apiary ./cmd/apiary

# Packages free of cgo also run under the race detector (the llama.cpp
# packages would need a second cold C++ build for it).
RACE_PKGS = $(shell $(GO) list -f '{{if not .CgoFiles}}{{$$cgo := false}}{{range .Deps}}{{if eq . "$(OLLAMA_MOD)/llama"}}{{$$cgo = true}}{{end}}{{end}}{{if not $$cgo}}{{.ImportPath}}{{end}}{{end}}' ./...)

test: deps build
	APIARY_BIN=$(CURDIR)/bin/apiary $(GO) test $(TEST_FLAGS) ./...
	APIARY_BIN=$(CURDIR)/bin/apiary $(GO) test -race $(TEST_FLAGS) $(RACE_PKGS)

demo: deps build
	@./scripts/demo.sh

bench: deps build
	APIARY_BIN=$(CURDIR)/bin/apiary $(GO) test -run '^$$' -bench . -benchtime 3x ./...

# Generation speed through the worker's HTTP API vs the engine in-process.
bench-worker: deps build
	APIARY_BIN=$(CURDIR)/bin/apiary $(GO) test -run '^$$' -bench WorkerHTTPvsInProcess -benchtime 8x -timeout 30m ./internal/llamacpp/

clean:
	rm -rf bin
