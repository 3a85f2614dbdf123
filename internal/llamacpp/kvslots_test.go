package llamacpp_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/kvcache"
	"github.com/apiary-llm/apiary/internal/llamacpp"
	"github.com/apiary-llm/apiary/internal/testmodel"
	"github.com/google/go-cmp/cmp"
)

// kvModel writes a test model of the given seed and dimension.
func kvModel(t *testing.T, seed int64, dim int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := testmodel.WriteFile(path, testmodel.Options{Seed: seed, Layers: 2, Dim: dim}); err != nil {
		t.Fatal(err)
	}
	return path
}

func loadPath(t *testing.T, path string, slots, ctxPerSlot int) *llamacpp.Engine {
	t.Helper()
	e, err := llamacpp.Load(context.Background(), engine.Options{
		ModelPath: path, CtxSize: ctxPerSlot * slots, Slots: slots, Threads: 1, GPUDevice: -1,
	}, nil)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func kvKey(t *testing.T, path string, e *llamacpp.Engine) kvcache.Key {
	t.Helper()
	id, err := kvcache.Identify(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, slots, kvType := e.KVLayout()
	return kvcache.Key{Model: id, CtxPerSlot: ctx, Slots: slots, KVType: kvType, LlamaCpp: "test"}
}

func save(t *testing.T, root, path string, e *llamacpp.Engine) kvcache.Manifest {
	t.Helper()
	m, err := kvcache.Save(root, kvKey(t, path, e), func(put kvcache.Put) error {
		return e.ExportSlots(t.Context(), put)
	})
	if err != nil {
		t.Fatalf("save: %v", err)
	}
	return m
}

func restore(t *testing.T, root, path string, e *llamacpp.Engine) (kvcache.Manifest, error) {
	t.Helper()
	return kvcache.Restore(root, kvKey(t, path, e), func(slot int, tokens []int, state []byte) error {
		return e.ImportSlot(t.Context(), slot, tokens, state)
	})
}

// turns returns a conversation's first prompt and its next turn, which
// starts with the first prompt.
func turns(t *testing.T, e *llamacpp.Engine) (first, next []int) {
	t.Helper()
	first = prompt(t, e, "System: you are a bee keeper's assistant who answers in short sentences about hives, "+
		"queens, workers, drones, honey, wax and the seasons of the apiary.\n\nUser: when do bees swarm?\n\nAssistant:")
	next = slices.Concat(first, prompt(t, e, " In spring.\n\nUser: and in autumn?\n\nAssistant:")[1:])
	return first, next
}

// The KV cache a worker saves survives its engine: a new engine of the
// same model and settings restores it, the next turn decodes only its
// new tokens, and the greedy continuation is the one of an engine that
// never saved or restored anything.
func TestKVStateSurvivesAnotherEngine(t *testing.T) {
	path := kvModel(t, 1, 64)
	root := t.TempDir()
	greedy := func(p []int) engine.Request { return engine.Request{Prompt: p, MaxTokens: 12} }

	a := loadPath(t, path, 2, 256)
	first, next := turns(t, a)
	collect(t, a, greedy(first))
	m := save(t, root, path, a)
	// The slot holds the first prompt, then the tokens it generated.
	if len(m.Slots) != 1 || len(m.Slots[0].Tokens) <= len(first) || !slices.Equal(m.Slots[0].Tokens[:len(first)], first) {
		t.Fatalf("saved %+v, want one slot holding the first prompt's %d tokens and what followed", m.Slots, len(first))
	}
	a.Close()

	b := loadPath(t, path, 2, 256)
	if _, err := restore(t, root, path, b); err != nil {
		t.Fatalf("restore: %v", err)
	}
	restored, _ := collect(t, b, greedy(next))
	if got, want := b.PromptTokensReused(), int64(len(first)); got != want {
		t.Errorf("reused %d prompt tokens, want %d (the first prompt)", got, want)
	}
	if got, want := b.PromptTokensDecoded(), int64(len(next)-len(first)); got != want {
		t.Errorf("decoded %d prompt tokens, want %d (the new ones)", got, want)
	}

	c := loadPath(t, path, 2, 256)
	fresh, _ := collect(t, c, greedy(next))
	if c.PromptTokensReused() != 0 {
		t.Fatalf("a fresh engine reused %d tokens", c.PromptTokensReused())
	}
	if d := cmp.Diff(fresh, restored); d != "" {
		t.Fatalf("greedy continuation after a restore differs from a fresh engine's (-fresh +restored):\n%s", d)
	}
	t.Logf("next turn: %d prompt tokens, %d restored; %d KiB saved", len(next), len(first), m.Bytes()>>10)
}

// A save is refused, and no slot loaded, when the restoring engine has
// another context size or another model (same shape, other weights).
func TestKVRestoreRefusesOtherSettingsAndModels(t *testing.T) {
	path := kvModel(t, 1, 64)
	root := t.TempDir()
	a := loadPath(t, path, 1, 256)
	first, _ := turns(t, a)
	collect(t, a, engine.Request{Prompt: first, MaxTokens: 2})
	save(t, root, path, a)

	b := loadPath(t, path, 1, 512)
	if _, err := restore(t, root, path, b); !errors.Is(err, kvcache.ErrMismatch) {
		t.Fatalf("restore into another context size: %v, want ErrMismatch", err)
	} else {
		t.Log(err)
	}

	// The model file rewritten in place with other weights (same name,
	// same size): its save is not found, nothing is loaded, and the new
	// model answers as a fresh engine does.
	save(t, root, path, a)
	a.Close()
	if err := testmodel.WriteFile(path, testmodel.Options{Seed: 2, Layers: 2, Dim: 64}); err != nil {
		t.Fatal(err)
	}
	c := loadPath(t, path, 1, 256)
	if _, err := restore(t, root, path, c); !errors.Is(err, kvcache.ErrNoSave) && !errors.Is(err, kvcache.ErrMismatch) {
		t.Fatalf("restore after the model file changed: %v, want ErrNoSave or ErrMismatch", err)
	}
	got, _ := collect(t, c, engine.Request{Prompt: first, MaxTokens: 8})
	fresh, _ := collect(t, loadPath(t, path, 1, 256), engine.Request{Prompt: first, MaxTokens: 8})
	if c.PromptTokensReused() != 0 || !slices.Equal(got, fresh) {
		t.Fatalf("the other model reused %d tokens; output %v, fresh %v", c.PromptTokensReused(), got, fresh)
	}
}

// States llama.cpp cannot use (cut short, of another model shape) are
// refused by ImportSlot with an error, the slot stays empty and the
// engine generates as before.
func TestKVImportRefusesBadStates(t *testing.T) {
	path := kvModel(t, 1, 64)
	a := loadPath(t, path, 1, 256)
	first, _ := turns(t, a)
	want, _ := collect(t, a, engine.Request{Prompt: first, MaxTokens: 8})
	var state []byte
	if err := a.ExportSlots(t.Context(), func(_ int, _ []int, s []byte) error {
		state = slices.Clone(s)
		return nil
	}); err != nil || state == nil {
		t.Fatalf("export: %v (%d bytes)", err, len(state))
	}

	wide := loadPath(t, kvModel(t, 1, 128), 1, 256)
	var wideState []byte
	collect(t, wide, engine.Request{Prompt: first, MaxTokens: 1})
	if err := wide.ExportSlots(t.Context(), func(_ int, _ []int, s []byte) error {
		wideState = slices.Clone(s)
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	b := loadPath(t, path, 1, 256)
	for name, bad := range map[string][]byte{
		"cut short":         state[:len(state)/2],
		"header only":       state[:12],
		"other model shape": wideState,
	} {
		if err := b.ImportSlot(t.Context(), 0, first, bad); err == nil {
			t.Errorf("%s: imported", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	if err := b.ImportSlot(t.Context(), 0, first[:len(first)-3], state); err == nil {
		t.Error("a state imported for fewer tokens than it holds")
	}
	got, _ := collect(t, b, engine.Request{Prompt: first, MaxTokens: 8})
	if b.PromptTokensReused() != 0 {
		t.Errorf("reused %d tokens after refused imports", b.PromptTokensReused())
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("output after refused imports (-want +got):\n%s", d)
	}
}
