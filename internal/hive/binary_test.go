package hive

import (
	"testing"

	"github.com/apiary-llm/apiary/internal/testbin"
)

// apiaryBin is the real apiary binary, for the tests that run real workers
// ($APIARY_BIN, or built once per test binary by testbin).
func apiaryBin(t testing.TB) string { return testbin.Path(t) }

// withReal runs real `apiary worker` processes of $APIARY_BIN.
func withReal(t testing.TB) hiveOpt {
	bin := apiaryBin(t)
	return func(c *Config) {
		c.WorkerPath = bin
		c.WorkerEnv = []string{}
	}
}
