package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/testhub"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// `apiary models pull` whose download stops coming while the connection
// stays open (it hung at 40% for 200 s) drops the connection after
// --stall-timeout without a byte, says so, and resumes where it was.
func TestModelsPullResumesAStalledDownload(t *testing.T) {
	var tiny bytes.Buffer
	if err := testmodel.Write(&tiny, testmodel.Options{Seed: 3}); err != nil {
		t.Fatal(err)
	}
	hub := testhub.New(t, "org/tiny-GGUF", map[string][]byte{"tiny-Q4_K_M.gguf": tiny.Bytes()})
	hub.StallAfter("tiny-Q4_K_M.gguf", 1000)
	dir := t.TempDir()
	code, out, errOut := apiary(t, "models", "pull", "--models-dir", dir, "--stall-timeout", "200ms", "hf://org/tiny-GGUF:Q4_K_M")
	if code != 0 || !strings.Contains(out, "pulled tiny-Q4_K_M") {
		t.Fatalf("models pull: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "pull tiny-Q4_K_M: no bytes for 200ms; resuming at 1000 bytes\n") {
		t.Errorf("stderr does not say the download stalled and resumed:\n%s", errOut)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "tiny-Q4_K_M.gguf")); !bytes.Equal(got, tiny.Bytes()) {
		t.Error("the pulled file differs from the Hub's")
	}
	if n := hub.Served.Load(); n != int64(tiny.Len()) {
		t.Errorf("the Hub served %d bytes, want %d: resumed, not restarted", n, tiny.Len())
	}
}
