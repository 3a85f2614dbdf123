package modelstore_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/gguf"
	"github.com/apiary-llm/apiary/internal/modelstore"
	"github.com/apiary-llm/apiary/internal/testmodel"
	"github.com/google/go-cmp/cmp"
)

// tinyModel returns the bytes of the default test model.
func tinyModel(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := testmodel.Write(&buf, testmodel.Options{}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// dirEntries lists the names in dir.
func dirEntries(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestDefaultDir(t *testing.T) {
	tests := []struct {
		xdg, home, want string
	}{
		{"/data", "/home/bee", "/data/apiary/models"},
		{"", "/home/bee", "/home/bee/.local/share/apiary/models"},
		{"relative", "/home/bee", "relative/apiary/models"},
	}
	for _, tt := range tests {
		t.Setenv("XDG_DATA_HOME", tt.xdg)
		t.Setenv("HOME", tt.home)
		got, err := modelstore.DefaultDir()
		if err != nil || got != tt.want {
			t.Errorf("XDG_DATA_HOME=%q HOME=%q: DefaultDir() = %q, %v; want %q", tt.xdg, tt.home, got, err, tt.want)
		}
	}
}

func TestCheckRef(t *testing.T) {
	for _, ref := range []string{"tiny", "Llama-3.2-1B-Instruct-Q4_K_M", "a", "x_1.5", strings.Repeat("a", 128)} {
		if err := modelstore.CheckRef(ref); err != nil {
			t.Errorf("CheckRef(%q) = %v, want nil", ref, err)
		}
	}
	for _, ref := range []string{"", ".hidden", "-flag", "a/b", "../x", "a b", "ü", strings.Repeat("a", 129)} {
		if err := modelstore.CheckRef(ref); !errors.Is(err, modelstore.ErrBadRef) {
			t.Errorf("CheckRef(%q) = %v, want ErrBadRef", ref, err)
		}
	}
}

func TestResolve(t *testing.T) {
	dir := t.TempDir()
	tiny := filepath.Join(dir, "tiny.gguf")
	writeFile(t, tiny, tinyModel(t))
	tests := []struct {
		in, want string
		err      error
	}{
		{"tiny", tiny, nil},
		{tiny, tiny, nil},
		{"other", "", modelstore.ErrNotFound},
		{filepath.Join(dir, "other.gguf"), "", modelstore.ErrNotFound},
		{"../tiny", "", modelstore.ErrNotFound}, // a path, relative to the working directory
		{"bad ref", "", modelstore.ErrBadRef},
		{dir + "/", "", modelstore.ErrNotFound}, // a directory
	}
	for _, tt := range tests {
		got, err := modelstore.Resolve(dir, tt.in)
		if got != tt.want || !errors.Is(err, tt.err) {
			t.Errorf("Resolve(%q) = %q, %v; want %q, %v", tt.in, got, err, tt.want, tt.err)
		}
	}
}

func TestList(t *testing.T) {
	dir := t.TempDir()
	tiny := tinyModel(t)
	writeFile(t, filepath.Join(dir, "tiny.gguf"), tiny)
	writeFile(t, filepath.Join(dir, "broken.gguf"), tiny[:1000])
	writeFile(t, filepath.Join(dir, "notes.txt"), []byte("not a model"))
	writeFile(t, filepath.Join(dir, ".tiny.gguf.123.partial"), tiny[:10])
	writeFile(t, filepath.Join(dir, "bad name.gguf"), tiny)
	if err := os.Mkdir(filepath.Join(dir, "folder.gguf"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("tiny.gguf", filepath.Join(dir, "alias.gguf")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("nowhere.gguf", filepath.Join(dir, "dangling.gguf")); err != nil {
		t.Fatal(err)
	}

	models, err := modelstore.List(dir)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	type row struct {
		Ref, Arch string
		Size      int64
		Params    uint64
		Error     string
	}
	var got []row
	for _, m := range models {
		r := row{Ref: m.Ref, Size: m.Size, Error: m.Error}
		if m.Info != nil {
			r.Arch, r.Params = m.Info.Architecture, m.Info.ParameterCount
		}
		if m.Path != filepath.Join(dir, m.Ref+".gguf") {
			t.Errorf("%s: path %s", m.Ref, m.Path)
		}
		got = append(got, r)
	}
	params := parse(t, tiny).Info().ParameterCount
	want := []row{
		{Ref: "alias", Arch: "llama", Size: int64(len(tiny)), Params: params},
		{Ref: "broken", Size: 1000, Error: `metadata entry 14 ("tokenizer.ggml.tokens"): array length (of string) 354 exceeds the 333 bytes left in the file`},
		{Ref: "dangling", Error: "stat " + filepath.Join(dir, "dangling.gguf") + ": no such file or directory"},
		{Ref: "tiny", Arch: "llama", Size: int64(len(tiny)), Params: params},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("List (-want +got):\n%s", diff)
	}

	models, err = modelstore.List(filepath.Join(dir, "missing"))
	if err != nil || len(models) != 0 {
		t.Errorf("List(missing dir) = %v, %v; want no models", models, err)
	}
	if _, err := modelstore.List(filepath.Join(dir, "notes.txt")); err == nil {
		t.Error("List of a file succeeded")
	}
}

func parse(t *testing.T, b []byte) *gguf.File {
	t.Helper()
	f, err := gguf.Read(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestWriteFile(t *testing.T) {
	tiny := tinyModel(t)
	copyTiny := func(w io.Writer) error { _, err := w.Write(tiny); return err }
	errWrite := errors.New("generator broke")
	tests := []struct {
		name      string
		existing  []byte // content of the target before, nil for none
		overwrite bool
		write     func(io.Writer) error
		err       error // nil: the model lands
	}{
		{name: "new", write: copyTiny},
		{name: "exists", existing: []byte("keep me"), write: copyTiny, err: modelstore.ErrExists},
		{name: "overwrite", existing: []byte("old"), overwrite: true, write: copyTiny},
		{name: "write error", write: func(io.Writer) error { return errWrite }, err: errWrite},
		{name: "not gguf", write: func(w io.Writer) error { _, err := io.WriteString(w, "<html>"); return err }, err: gguf.ErrNotGGUF},
		{name: "truncated", write: func(w io.Writer) error { _, err := w.Write(tiny[:len(tiny)-1]); return err }, err: gguf.ErrTruncated},
		{name: "no architecture", write: func(w io.Writer) error { return gguf.Write(w, nil, nil) }, err: gguf.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "m.gguf")
			if tt.existing != nil {
				writeFile(t, path, tt.existing)
			}
			f, err := modelstore.WriteFile(path, tt.overwrite, tt.write)
			if !errors.Is(err, tt.err) {
				t.Fatalf("WriteFile = %v, want %v", err, tt.err)
			}
			got, _ := os.ReadFile(path)
			want := tt.existing
			if tt.err == nil {
				want = tiny
				if f == nil || f.Architecture() != "llama" {
					t.Errorf("WriteFile returned %v, want the model's header", f)
				}
			}
			if !bytes.Equal(got, want) {
				t.Errorf("the target holds %d bytes, want %d", len(got), len(want))
			}
			wantEntries := []string{"m.gguf"}
			if want == nil {
				wantEntries = nil
			}
			if diff := cmp.Diff(wantEntries, dirEntries(t, dir)); diff != "" {
				t.Errorf("directory entries (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWriteFileMissingDir(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "m.gguf")
	_, err := modelstore.WriteFile(path, false, func(io.Writer) error { return nil })
	if want := "cannot write " + path + ": no such file or directory"; err == nil || err.Error() != want {
		t.Errorf("WriteFile = %v, want %s", err, want)
	}
}
