package hive

import (
	"testing"

	"github.com/apiary-llm/apiary/internal/cpuvariant"
	"github.com/apiary-llm/apiary/internal/testbin"
)

// apiaryBin is the real apiary binary, for the tests that run real workers
// ($APIARY_BIN, or built once per test binary by testbin).
func apiaryBin(t testing.TB) string { return testbin.Path(t) }

// withReal runs real `apiary worker` processes: the build for this CPU,
// as a hive running $APIARY_BIN (the portable build) would pick it.
func withReal(t testing.TB) hiveOpt {
	c, err := cpuvariant.ForPortable(apiaryBin(t))
	if err != nil {
		t.Fatal(err)
	}
	bin := c.Path
	return func(c *Config) {
		c.WorkerPath = bin
		c.WorkerEnv = []string{}
	}
}
