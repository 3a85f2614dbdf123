package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

var fakeEngine builtOnce

// FakeEngine returns the scripted external engine of the hive's tests
// (internal/hive/testdata/fakeengine), built once per test binary into
// the directory Cleanup removes.
func FakeEngine(t testing.TB) string {
	t.Helper()
	return fakeEngine.get(t, "", "these tests need the fake engine: building it failed", buildFakeEngine)
}

func buildFakeEngine() (string, error) {
	goTool, root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	d, err := os.MkdirTemp("", "apiary-test-engine-")
	if err != nil {
		return "", err
	}
	engineDirs = append(engineDirs, d)
	p := filepath.Join(d, "fakeengine")
	cmd := exec.Command(goTool, "build", "-o", p, "./internal/hive/testdata/fakeengine")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build fakeengine: %w\n%s", err, msg)
	}
	return p, nil
}

// engineDirs are the directories FakeEngine built into; Cleanup removes
// them.
var engineDirs []string
