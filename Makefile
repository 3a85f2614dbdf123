# apiary build. `make build` puts the binary at bin/apiary with the
# llama.cpp libraries it loads beside it; `make test` runs every test.
# llama.cpp is built by scripts/llamacpp.sh from a pinned source (the git
# bundle the npm package node-llama-cpp ships) with its own CMake build,
# once per pin, into a cache outside the tree (a cold build takes minutes;
# later ones nothing).

SHELL := /bin/bash
GO ?= go
BIN ?= bin

LLAMA := $(shell ./scripts/llamacpp.sh prefix)
LLAMA_LIB := $(LLAMA)/lib
LLAMA_PIN = $(shell sed -n 's/^tag=//p;s/^commit=//p;s/^date=//p' $(LLAMA)/pin 2>/dev/null | paste -sd ' ')
VERSION_PKG := github.com/apiary-llm/apiary/internal/version

# apiary's own C and C++ (the binding's helpers) at llama.cpp's Release
# flags; llama.cpp's kernels are in its libraries, one CPU backend per
# instruction-set level, chosen at run time (internal/cpuvariant).
OPT_FLAGS := -O3 -DNDEBUG
export CGO_ENABLED := 1
export CGO_CFLAGS := $(OPT_FLAGS)
export CGO_CXXFLAGS := $(OPT_FLAGS)
export CGO_CPPFLAGS := -I$(LLAMA)/include
# Test binaries are built elsewhere: they find the libraries in the cache.
# bin/apiary finds them beside itself ($ORIGIN, set in build).
export CGO_LDFLAGS := -L$(LLAMA_LIB) -Wl,-rpath,$(LLAMA_LIB)

TEST_FLAGS ?= -count=1 -timeout 60m

.PHONY: all build llama cuda deps deps-build lint llama-server kube kube-background test demo bench bench-worker bench-prefix clean

all: build

# deps installs what the build and the tests need on Debian 12 (skipped
# when present); deps-build what the build alone needs: the compiler, and
# llama.cpp's build tools (CMake, git, npm) only until its libraries are
# in the cache. `make demo` needs nothing more (TestDemoInstallsOnlyWhatTheBuildNeeds).
deps:
	@./scripts/deps.sh

deps-build:
	@./scripts/deps.sh build

# llama builds llama.cpp's libraries and llama-server into the cache.
llama: deps-build
	@./scripts/llamacpp.sh build >/dev/null

build: llama
	@mkdir -p $(BIN)
	CGO_LDFLAGS="-L$(LLAMA_LIB) -Wl,-rpath,\$$ORIGIN" \
		$(GO) build -ldflags "-X '$(VERSION_PKG).LlamaCpp=$(LLAMA_PIN)'" -o $(BIN)/apiary ./cmd/apiary
	@rm -f $(BIN)/apiary-x86-64-v3 $(BIN)/apiary-x86-64-v4 $(BIN)/libggml-cpu-*.so
	@for f in $(LLAMA_LIB)/*.so; do install -m 0755 "$$f" $(BIN)/; done

# llama.cpp's CUDA backend, bin/libggml-cuda.so, from the same source and
# commit (CMake and nvcc; see docs/gpu.md). Workers load it at run time;
# without it a node's GPUs are reported unusable.
cuda: build
	@./scripts/llamacpp.sh cuda >/dev/null
	install -m 0755 $(LLAMA_LIB)/libggml-cuda.so $(BIN)/
	install -m 0644 $(LLAMA_LIB)/libggml-cuda.cuda-version $(BIN)/

# Packages that do not link the llama.cpp binding also run under the race
# detector.
RACE_PKGS = $(shell $(GO) list -f '{{if not .CgoFiles}}{{$$cgo := false}}{{range .Deps}}{{if eq . "github.com/apiary-llm/apiary/internal/llamacpp"}}{{$$cgo = true}}{{end}}{{end}}{{if not $$cgo}}{{.ImportPath}}{{end}}{{end}}' ./...)

# go vet and staticcheck (pinned in go.mod as a tool), both clean; vet
# also with the benchmarks' build tags, of the packages that have files
# with them, so that those files still build.
TAGGED_PKGS = $(shell grep -rlE --include='*.go' '^//go:build.*(llamaswap|llamaserver)' internal | xargs -r -n1 dirname | sort -u | sed 's|^|./|')
lint: llama
	$(GO) vet ./...
	$(GO) vet -tags llamaswap,llamaserver $(TAGGED_PKGS)
	$(GO) tool staticcheck ./...

# llama.cpp's llama-server, which the external-engine tests run: built
# in the libraries' tree, from the same source and commit
# (internal/testbin.LlamaServer).
# kube builds the test control plane of Kubernetes mode (scripts/kube.sh:
# etcd, kube-apiserver, kube-scheduler, kube-controller-manager and
# kubectl of one pinned release, and stand-in nodes) into the cache, once
# per version of tools/kubeplane (minutes from cold).
kube:
	@./scripts/kube.sh build >/dev/null

llama-server: llama
	@./scripts/llamacpp.sh server >/dev/null

# kube-background starts that build (cold: the largest of make test's)
# beside the rest at the lowest CPU priority, so that it takes the CPU
# the builds and tests leave idle; it stops if make does. The Kubernetes
# process tests wait for it (StartKube: scripts/kube.sh up), and so does
# make test before kubeplane's own tests.
kube-background:
	@./scripts/kube.sh background $$PPID

# Two go test runs, side by side (the race run's lines start with
# "race: "): every package; and the packages that do not link llama.cpp
# under the race detector. Both -vet=off: lint ran go vet in full, a
# superset of the checks go test runs. The process tests (files named
# *_process_test.go: they run apiary as processes, which the race
# detector does not see into) are built `!race` and run in the first
# alone; so are the SSH-node tests, which hold fixed resources (network
# namespaces) the two runs must not share. Then kubeplane's own tests.
# llama.cpp's CPU backends: the levels the tests load (this machine's,
# and sse42; LLAMA_CPU_LEVELS=test), not all fourteen, which are
# one source compiled for each level (a later `make build` adds them).
test: export LLAMA_CPU_LEVELS := test
test: deps kube-background build lint llama-server
	@echo 'APIARY_BIN=$(abspath $(BIN))/apiary $(GO) test -vet=off $(TEST_FLAGS) ./...'
	@echo 'APIARY_BIN=$(abspath $(BIN))/apiary $(GO) test -vet=off -race $(TEST_FLAGS) $(RACE_PKGS)'
	@export APIARY_BIN=$(abspath $(BIN))/apiary; \
	  $(GO) test -vet=off $(TEST_FLAGS) ./... & plain=$$!; \
	  (set -o pipefail; $(GO) test -vet=off -race $(TEST_FLAGS) $(RACE_PKGS) 2>&1 | sed -u 's/^/race: /') & race=$$!; \
	  wait $$plain; p=$$?; wait $$race; r=$$?; \
	  if [ $$p != 0 ] || [ $$r != 0 ]; then echo "go test: exit $$p; go test -race: exit $$r" >&2; exit 1; fi
	@./scripts/kube.sh build >/dev/null
	cd tools/kubeplane && $(GO) test $(TEST_FLAGS) ./...

# The demo builds only the CPU backend this machine loads (a later
# `make build` adds the others), then runs scripts/demo.sh: the test
# model answers a prompt through apiary infer --ephemeral.
demo: export LLAMA_CPU_LEVELS := host
demo: build
	@./scripts/demo.sh

bench: deps build
	APIARY_BIN=$(abspath $(BIN))/apiary $(GO) test -run '^$$' -bench . -benchtime 3x ./...

# Prefix-aware routing against least-loaded: the multi-turn and the
# shared-system-prompt workloads (docs/benchmarks.md, "Routing by prefix").
bench-prefix: deps build
	APIARY_BIN=$(abspath $(BIN))/apiary $(GO) test -run '^$$' -bench PrefixRouting -benchtime 1x -timeout 30m ./internal/queen/

# Generation speed through the worker's HTTP API vs the engine in-process.
bench-worker: deps build
	APIARY_BIN=$(abspath $(BIN))/apiary $(GO) test -run '^$$' -bench WorkerHTTPvsInProcess -benchtime 8x -timeout 30m ./internal/llamacpp/

clean:
	rm -rf bin
