package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDocsRunAsWritten runs the sh blocks of docs/kubernetes.md's section
// "The test control plane", in order, in one bash from the repository's
// root, as a reader pastes them. (The other sections' blocks need a real
// cluster and an image of apiary.)
func TestDocsRunAsWritten(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "kubernetes.md"))
	if err != nil {
		t.Fatal(err)
	}
	var script strings.Builder
	script.WriteString("set -euo pipefail\n")
	in, blocks, section := false, 0, false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case !in && strings.HasPrefix(line, "## "):
			section = line == "## The test control plane"
		case !section:
		case !in && line == "```sh":
			in, blocks = true, blocks+1
		case in && line == "```":
			in = false
		case in:
			script.WriteString(line + "\n")
		}
	}
	if blocks == 0 {
		t.Fatal("docs/kubernetes.md's section The test control plane has no sh block")
	}
	cmd := exec.CommandContext(t.Context(), "bash", "-c", script.String())
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("docs/kubernetes.md's blocks: %v\n%s\nscript:\n%s", err, out, script.String())
	}
	for _, want := range []string{"node-1   Ready", "node-2   Ready", "hello from 127."} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the blocks' output lacks %q:\n%s", want, out)
		}
	}
}
