package modelstore_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/apiary-llm/apiary/internal/gguf"
	"github.com/apiary-llm/apiary/internal/modelstore"
	"github.com/apiary-llm/apiary/internal/testhub"
)

// benchModelSize is the size of the benchmark's model: one F32 tensor of
// 256 MiB.
const benchModelSize = 256 << 20

// BenchmarkPullVsCurl pulls a 256 MiB model from a local stand-in for the
// Hub (the file list, then a 302 to a second server, as the Hub answers)
// with modelstore.Pull (sha256 while writing, the GGUF check, the rename),
// and the same file with curl -L into the same directory, alone and
// followed by sha256sum and sync (the same work as Pull's): the MB/s
// compare the puller with the plain download. curl must be installed.
func BenchmarkPullVsCurl(b *testing.B) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		b.Fatalf("the benchmark compares with curl, which is not installed: %v", err)
	}
	md := gguf.Metadata{{Key: "general.architecture", Value: gguf.String("llama")}}
	data := make([]byte, benchModelSize)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var buf bytes.Buffer
	if err := gguf.Write(&buf, md, []gguf.Tensor{{Name: "big.weight", Shape: []uint64{4096, benchModelSize / 4 / 4096}, Type: gguf.TypeF32, Data: data}}); err != nil {
		b.Fatal(err)
	}
	hub := testhub.New(b, "org/big-GGUF", map[string][]byte{"big-F32.gguf": buf.Bytes()})
	dir := b.TempDir()
	size := int64(buf.Len())
	b.Run("apiary", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			if _, err := modelstore.Pull(b.Context(), dir, "hf://org/big-GGUF:F32", modelstore.PullOptions{Overwrite: true}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("curl", func(b *testing.B) {
		b.SetBytes(size)
		out := filepath.Join(dir, "curl.gguf")
		for b.Loop() {
			cmd := exec.Command(curl, "-sSfL", "-o", out, hub.API.URL+"/org/big-GGUF/resolve/main/big-F32.gguf")
			if msg, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("curl: %v: %s", err, msg)
			}
		}
		if st, err := os.Stat(out); err != nil || st.Size() != size {
			b.Fatalf("curl wrote %v bytes (%v), want %d", st, err, size)
		}
	})
	// The same work as Pull's: the download, its sha256, and the file on
	// disk (fsync) before it counts as pulled.
	b.Run("curl+sha256sum+sync", func(b *testing.B) {
		b.SetBytes(size)
		out := filepath.Join(dir, "curl.gguf")
		for b.Loop() {
			script := `"$0" -sSfL -o "$1" "$2" && sha256sum "$1" >/dev/null && sync "$1"`
			cmd := exec.Command("sh", "-c", script, curl, out, hub.API.URL+"/org/big-GGUF/resolve/main/big-F32.gguf")
			if msg, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("curl, sha256sum, sync: %v: %s", err, msg)
			}
		}
	})
}
