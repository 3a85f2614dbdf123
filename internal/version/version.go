// Package version holds apiary's version string, set at link time with
// -ldflags "-X github.com/apiary-llm/apiary/internal/version.Version=…".
package version

// Version is the running binary's version.
var Version = "0.1.0-dev"

// LlamaCpp is the llama.cpp the binary links: its tag, commit and commit
// date, set at link time by `make build` from scripts/llamacpp.sh's pin;
// "" for a binary built otherwise.
var LlamaCpp string
