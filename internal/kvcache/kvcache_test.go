package kvcache

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func testKey() Key {
	return Key{Model: ModelFile{Name: "m.gguf", Size: 100, ModTime: 7}, CtxPerSlot: 64, Slots: 2, KVType: "f16/f16", LlamaCpp: "b1"}
}

// saveOne writes a save of two slots and returns its directory.
func saveOne(t *testing.T, root string, key Key) string {
	t.Helper()
	_, err := Save(root, key, func(put Put) error {
		if err := put(0, []int{1, 2, 3}, []byte("state zero")); err != nil {
			return err
		}
		return put(1, []int{4, 5}, []byte("state one"))
	})
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, key.Model.dirName())
}

type slotGot struct {
	Slot   int
	Tokens []int
	State  string
}

func restoreAll(root string, key Key) ([]slotGot, error) {
	var got []slotGot
	_, err := Restore(root, key, func(slot int, tokens []int, state []byte) error {
		got = append(got, slotGot{slot, tokens, string(state)})
		return nil
	})
	return got, err
}

func TestSaveRestoreRoundTrip(t *testing.T) {
	root := t.TempDir()
	saveOne(t, root, testKey())
	got, err := restoreAll(root, testKey())
	if err != nil {
		t.Fatal(err)
	}
	want := []slotGot{{0, []int{1, 2, 3}, "state zero"}, {1, []int{4, 5}, "state one"}}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("restored (-want +got):\n%s", d)
	}
	if _, err := restoreAll(t.TempDir(), testKey()); !errors.Is(err, ErrNoSave) {
		t.Fatalf("restore from an empty root: %v, want ErrNoSave", err)
	}
}

// Every difference in the key refuses the save before any slot is
// loaded, and the refused save is removed.
func TestRestoreRefusesAnotherKey(t *testing.T) {
	for name, change := range map[string]func(*Key){
		"model rewritten": func(k *Key) { k.Model.ModTime++ },
		"model size":      func(k *Key) { k.Model.Size++ },
		"other model":     func(k *Key) { k.Model.Name = "n.gguf" },
		"ctx size":        func(k *Key) { k.CtxPerSlot = 128 },
		"slots":           func(k *Key) { k.Slots = 4 },
		"kv type":         func(k *Key) { k.KVType = "q8_0/q8_0" },
		"llama.cpp":       func(k *Key) { k.LlamaCpp = "b2" },
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			saved := testKey()
			dir := saveOne(t, root, saved)
			want := saved
			change(&want)
			// A save of another model file lives in another directory:
			// put this one where the other's would be, as a save that
			// lies about its model would be.
			if err := os.Rename(dir, filepath.Join(root, want.Model.dirName())); err != nil && want.Model != saved.Model {
				t.Fatal(err)
			}
			got, err := restoreAll(root, want)
			if !errors.Is(err, ErrMismatch) || len(got) != 0 {
				t.Fatalf("restore: %v, %d slots loaded; want ErrMismatch and none", err, len(got))
			}
			t.Log(err)
			if _, err := os.Stat(filepath.Join(root, want.Model.dirName())); !os.IsNotExist(err) {
				t.Fatalf("refused save still on disk: %v", err)
			}
		})
	}
}

func TestRestoreRefusesDamagedFiles(t *testing.T) {
	for name, damage := range map[string]func(dir string) error{
		"truncated": func(dir string) error { return os.Truncate(filepath.Join(dir, "slot-1.state"), 3) },
		"flipped": func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "slot-1.state"), []byte("state One"), 0o600)
		},
		"missing": func(dir string) error { return os.Remove(filepath.Join(dir, "slot-0.state")) },
		"manifest": func(dir string) error {
			return os.WriteFile(filepath.Join(dir, manifestName), []byte(`{"format":1,`), 0o600)
		},
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			dir := saveOne(t, root, testKey())
			if err := damage(dir); err != nil {
				t.Fatal(err)
			}
			got, err := restoreAll(root, testKey())
			if !errors.Is(err, ErrCorrupt) || len(got) != 0 {
				t.Fatalf("restore: %v, %d slots loaded; want ErrCorrupt and none", err, len(got))
			}
			t.Log(err)
		})
	}
}

func TestPlanRemovesLeastRecentlyUsed(t *testing.T) {
	t0 := time.Unix(1000, 0)
	entries := []entry{{"a", 40, t0.Add(2)}, {"b", 40, t0}, {"c", 40, t0.Add(1)}, {"unfinished", 5, time.Time{}}}
	for _, tc := range []struct {
		limit int64
		want  []string
	}{
		{200, nil},
		{124, []string{"unfinished"}},
		{100, []string{"unfinished", "b"}},
		{40, []string{"unfinished", "b", "c"}},
		{0, []string{"unfinished", "b", "c", "a"}},
	} {
		if d := cmp.Diff(tc.want, plan(entries, tc.limit)); d != "" {
			t.Errorf("limit %d (-want +got):\n%s", tc.limit, d)
		}
	}
}

func TestPruneKeepsTheRecentlyRestored(t *testing.T) {
	root := t.TempDir()
	a, b := testKey(), testKey()
	b.Model.Name = "b.gguf"
	dirA := saveOne(t, root, a)
	dirB := saveOne(t, root, b)
	old := time.Now().Add(-time.Hour)
	for _, d := range []string{dirA, dirB} {
		if err := os.Chtimes(filepath.Join(d, manifestName), old, old); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := restoreAll(root, a); err != nil { // a is now the most recently used
		t.Fatal(err)
	}
	var sizeA int64 // room for one save
	files, _ := os.ReadDir(dirA)
	for _, f := range files {
		info, _ := f.Info()
		sizeA += info.Size()
	}
	removed, err := Prune(root, sizeA)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{dirB}, removed); d != "" {
		t.Fatalf("removed (-want +got):\n%s", d)
	}
	if _, err := os.Stat(dirA); err != nil {
		t.Fatal(err)
	}
}

func TestRemoveUnfinished(t *testing.T) {
	root := t.TempDir()
	done := saveOne(t, root, testKey())
	if err := os.MkdirAll(filepath.Join(root, "x-123.tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	removed, err := RemoveUnfinished(root)
	if err != nil || len(removed) != 1 {
		t.Fatalf("removed %v, %v; want the one .tmp", removed, err)
	}
	if _, err := os.Stat(done); err != nil {
		t.Fatalf("a finished save was removed: %v", err)
	}
}
