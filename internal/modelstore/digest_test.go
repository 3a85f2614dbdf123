package modelstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// A model's digest is the sha256 of its bytes (of every part, in order,
// for a split model); Lookup answers "" until Run has hashed the file, and
// hashes it again once it changes.
func TestDigestsHashWhatIsLookedUp(t *testing.T) {
	for _, inline := range []bool{true, false} {
		t.Run(map[bool]string{true: "inline", false: "background"}[inline], func(t *testing.T) { testDigests(t, inline) })
	}
}

func testDigests(t *testing.T, inline bool) {
	dir := t.TempDir()
	one := filepath.Join(dir, "one"+Ext)
	if err := os.WriteFile(one, []byte("bees"), 0o644); err != nil {
		t.Fatal(err)
	}
	parts := [][]byte{[]byte("part one, "), []byte("part two")}
	for i, b := range parts {
		if err := os.WriteFile(filepath.Join(dir, "big-0000"+string(rune('1'+i))+"-of-00002"+Ext), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sum := func(b []byte) string { s := sha256.Sum256(b); return "sha256:" + hex.EncodeToString(s[:]) }
	model := func(path string) Model {
		t.Helper()
		m := Model{Path: path}
		paths := []string{path}
		if filepath.Base(path) == "big-00001-of-00002"+Ext {
			paths = append(paths, filepath.Join(dir, "big-00002-of-00002"+Ext))
		}
		for i, p := range paths {
			st, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				m.ModTime = st.ModTime()
			}
			m.Size += st.Size()
		}
		return m
	}
	d := NewDigests()
	if !inline {
		d.inlineMax = 0
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { d.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	wait := func(m Model, want string) {
		t.Helper()
		for got := d.Lookup(m); got != want; got = d.Lookup(m) {
			if got != "" {
				t.Fatalf("digest of %s: %s, want %s", m.Path, got, want)
			}
			select {
			case <-t.Context().Done():
				t.Fatalf("no digest of %s", m.Path)
			case <-time.After(time.Millisecond):
			}
		}
	}
	wait(model(one), sum([]byte("bees")))
	split := filepath.Join(dir, "big-00001-of-00002"+Ext)
	wait(model(split), sum([]byte("part one, part two")))

	// Changed: hashed again, the old digest never answered for it.
	later := time.Now().Add(time.Hour)
	if err := os.WriteFile(one, []byte("wasps!"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(one, later, later); err != nil {
		t.Fatal(err)
	}
	wait(model(one), sum([]byte("wasps!")))

	d.Forget([]Model{model(split)})
	d.mu.Lock()
	_, kept := d.known[one]
	d.mu.Unlock()
	if kept {
		t.Errorf("a model no longer listed is still remembered")
	}
}
