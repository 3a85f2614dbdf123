package testbin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	npmMu   sync.Mutex
	npmDirs = map[string]string{} // guarded by npmMu; "pkg@version" → prefix
)

// NPM returns the npm --prefix under which the unscoped package pkg is
// installed at exactly version (its node_modules/pkg), for tests that run
// a JavaScript client with node. It is installed once into the user's
// cache, ${XDG_CACHE_HOME:-~/.cache}/apiary/npm/<pkg>-<version>, and
// reused after; the tree holds no node_modules. A missing npm or a failed
// install fails the test (scripts/deps.sh installs node and npm).
func NPM(t testing.TB, pkg, version string) string {
	t.Helper()
	npmMu.Lock()
	defer npmMu.Unlock()
	key := pkg + "@" + version
	if dir, ok := npmDirs[key]; ok {
		return dir
	}
	dir, err := npmInstall(pkg, version)
	if err != nil {
		t.Fatalf("this test needs the npm package %s (run scripts/deps.sh for node and npm): %v", key, err)
	}
	npmDirs[key] = dir
	return dir
}

// npmInstall installs pkg@version unless the cache has it. It installs
// into a fresh directory beside the cache entry and renames it into
// place, so that a concurrent or interrupted install never leaves a
// half-written entry that looks whole.
func npmInstall(pkg, version string) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	root := filepath.Join(cache, "apiary", "npm")
	// A scoped package (@scope/name) gets one directory, @scope+name-version.
	name := strings.ReplaceAll(pkg, "/", "+") + "-" + version
	dir := filepath.Join(root, name)
	if got, err := installedVersion(dir, pkg); err == nil && got == version {
		return dir, nil
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	} else if err == nil {
		return "", fmt.Errorf("%s holds %s %s, not %s: remove it", dir, pkg, got, version)
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(root, name+".partial-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command(npm, "install", "--prefix", tmp, "--no-audit", "--no-fund", "--no-save", "--no-package-lock", pkg+"@"+version)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("npm install %s@%s: %w\n%s", pkg, version, err, out)
	}
	if got, err := installedVersion(tmp, pkg); err != nil || got != version {
		return "", fmt.Errorf("npm install %s@%s installed %q (%v)", pkg, version, got, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		// Another process put it there first: use theirs if it is whole.
		if got, err2 := installedVersion(dir, pkg); err2 != nil || got != version {
			return "", fmt.Errorf("moving the install into %s: %w", dir, err)
		}
	}
	return dir, nil
}

// installedVersion reads the version of pkg installed under prefix.
func installedVersion(prefix, pkg string) (string, error) {
	data, err := os.ReadFile(filepath.Join(prefix, "node_modules", pkg, "package.json"))
	if err != nil {
		return "", err
	}
	var m struct{ Version string }
	if err := json.Unmarshal(data, &m); err != nil {
		return "", fmt.Errorf("%s's package.json: %w", pkg, err)
	}
	return m.Version, nil
}
