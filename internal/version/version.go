// Package version holds apiary's version string, set at link time with
// -ldflags "-X github.com/apiary-llm/apiary/internal/version.Version=…".
package version

// Version is the running binary's version.
var Version = "0.1.0-dev"
