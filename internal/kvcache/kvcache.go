// Package kvcache keeps a worker's KV cache on disk across a swap: a
// worker that stops saves its slots' state (the tokens each slot holds
// and llama.cpp's sequence state for them) under the hive's data dir,
// and the next worker of the same model and context settings restores
// it before it serves. A save is used only when its Key matches the
// restoring worker's exactly and every file has the size and SHA-256
// its manifest records; anything else is refused, never loaded.
//
// Layout: ROOT/<model dir>/manifest.json beside slot-N.state files, one
// save per model file. Saves are bounded on disk by Prune (least
// recently used first).
package kvcache

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Format is the manifest's format version; another is refused.
const Format = 1

// manifestName is the manifest's file name in a save's directory.
const manifestName = "manifest.json"

var (
	// ErrNoSave means there is no save for the model.
	ErrNoSave = errors.New("no saved KV cache for this model")
	// ErrMismatch means a save was made for another model file or
	// other context settings.
	ErrMismatch = errors.New("saved KV cache does not match this worker")
	// ErrCorrupt means a save's files are not what its manifest says.
	ErrCorrupt = errors.New("saved KV cache is damaged")
	// ErrNothingToSave means no slot held tokens.
	ErrNothingToSave = errors.New("no slot holds tokens: nothing to save")
)

// ModelFile identifies a model file by name, size and modification
// time: a file replaced or rewritten under the same name is another.
type ModelFile struct {
	Name    string `json:"name"`
	Size    int64  `json:"size"`
	ModTime int64  `json:"mtime_unix_nano"`
}

// Identify reads path's identity.
func Identify(path string) (ModelFile, error) {
	st, err := os.Stat(path)
	if err != nil {
		return ModelFile{}, err
	}
	return ModelFile{Name: filepath.Base(path), Size: st.Size(), ModTime: st.ModTime().UnixNano()}, nil
}

// dirName is the directory of this model's save under the root: the file
// name (without .gguf) and a digest of the identity, so that another file
// under the same name gets a directory of its own.
func (m ModelFile) dirName() string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%d", m.Name, m.Size, m.ModTime))
	name := strings.Map(func(r rune) rune {
		if r == '/' || r == '\\' || r < ' ' {
			return '_'
		}
		return r
	}, strings.TrimSuffix(m.Name, ".gguf"))
	return name + "-" + hex.EncodeToString(sum[:6])
}

// Key is what a save must match to be restored: the model file and the
// context settings that shape the KV cache.
type Key struct {
	Model      ModelFile `json:"model"`
	CtxPerSlot int       `json:"ctx_per_slot"`
	Slots      int       `json:"slots"`
	KVType     string    `json:"kv_type"`   // the K and V cache types, e.g. "f16/f16"
	LlamaCpp   string    `json:"llama_cpp"` // the llama.cpp build that wrote the state
}

// mismatch says in words how got differs from k ("" when it does not).
func (k Key) mismatch(got Key) string {
	var why []string
	if got.Model != k.Model {
		why = append(why, fmt.Sprintf("model file %s (%d bytes, modified %s) is not %s (%d bytes, modified %s)",
			got.Model.Name, got.Model.Size, time.Unix(0, got.Model.ModTime).UTC().Format(time.RFC3339Nano),
			k.Model.Name, k.Model.Size, time.Unix(0, k.Model.ModTime).UTC().Format(time.RFC3339Nano)))
	}
	if got.CtxPerSlot != k.CtxPerSlot {
		why = append(why, fmt.Sprintf("context of %d tokens a slot, this worker has %d", got.CtxPerSlot, k.CtxPerSlot))
	}
	if got.Slots != k.Slots {
		why = append(why, fmt.Sprintf("%d slots, this worker has %d", got.Slots, k.Slots))
	}
	if got.KVType != k.KVType {
		why = append(why, fmt.Sprintf("KV cache type %s, this worker has %s", got.KVType, k.KVType))
	}
	if got.LlamaCpp != k.LlamaCpp {
		why = append(why, fmt.Sprintf("written by llama.cpp %q, this worker has %q", got.LlamaCpp, k.LlamaCpp))
	}
	return strings.Join(why, "; ")
}

// Manifest describes one save.
type Manifest struct {
	Format  int        `json:"format"`
	Key     Key        `json:"key"`
	SavedAt time.Time  `json:"saved_at"`
	Slots   []SlotSave `json:"slots"`
}

// SlotSave is one slot's saved state.
type SlotSave struct {
	Slot   int    `json:"slot"`
	Tokens []int  `json:"tokens"` // the tokens whose KV the state holds, from position 0
	File   string `json:"file"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// Bytes is the size of a save's state files.
func (m Manifest) Bytes() int64 {
	var n int64
	for _, s := range m.Slots {
		n += s.Bytes
	}
	return n
}

// Tokens is the number of tokens a save holds over all slots.
func (m Manifest) Tokens() int {
	n := 0
	for _, s := range m.Slots {
		n += len(s.Tokens)
	}
	return n
}

// Put writes one slot's state: the tokens it holds and llama.cpp's bytes.
type Put func(slot int, tokens []int, state []byte) error

// Save writes a save for key under root, replacing the model's earlier
// one. export calls put once per slot that holds tokens. The save is
// written beside and renamed into place: a save cut short leaves no
// manifest, and is never restored.
func Save(root string, key Key, export func(put Put) error) (Manifest, error) {
	dir := filepath.Join(root, key.Model.dirName())
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return Manifest{}, err
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return Manifest{}, err
	}
	m := Manifest{Format: Format, Key: key}
	err := export(func(slot int, tokens []int, state []byte) error {
		name := fmt.Sprintf("slot-%d.state", slot)
		if err := os.WriteFile(filepath.Join(tmp, name), state, 0o600); err != nil {
			return err
		}
		sum := sha256.Sum256(state)
		m.Slots = append(m.Slots, SlotSave{Slot: slot, Tokens: append([]int(nil), tokens...), File: name,
			Bytes: int64(len(state)), SHA256: hex.EncodeToString(sum[:])})
		return nil
	})
	if err == nil && len(m.Slots) == 0 {
		err = ErrNothingToSave
	}
	if err != nil {
		_ = os.RemoveAll(tmp)
		return Manifest{}, err
	}
	m.SavedAt = time.Now().UTC()
	b, err := json.Marshal(m)
	if err == nil {
		err = os.WriteFile(filepath.Join(tmp, manifestName), b, 0o600)
	}
	if err == nil {
		err = os.RemoveAll(dir)
	}
	if err == nil {
		err = os.Rename(tmp, dir)
	}
	if err != nil {
		_ = os.RemoveAll(tmp)
		return Manifest{}, err
	}
	return m, nil
}

// Restore finds key's model's save under root, checks it and hands each
// slot to load. It returns ErrNoSave when there is none, and an error
// wrapping ErrMismatch or ErrCorrupt (with why) for a save it refuses,
// before load is called for any slot: every file is checked first. A
// refused save is removed. A restored save counts as used now for Prune.
func Restore(root string, key Key, load Put) (Manifest, error) {
	dir := filepath.Join(root, key.Model.dirName())
	b, err := os.ReadFile(filepath.Join(dir, manifestName))
	if errors.Is(err, fs.ErrNotExist) {
		return Manifest{}, ErrNoSave
	}
	if err != nil {
		return Manifest{}, err
	}
	m, states, err := check(dir, b, key)
	if err != nil {
		if rmErr := os.RemoveAll(dir); rmErr != nil {
			err = errors.Join(err, rmErr)
		}
		return Manifest{}, err
	}
	for i, s := range m.Slots {
		if err := load(s.Slot, s.Tokens, states[i]); err != nil {
			return m, err
		}
	}
	now := time.Now()
	_ = os.Chtimes(filepath.Join(dir, manifestName), now, now)
	return m, nil
}

// check reads the manifest b of the save in dir and its state files,
// and refuses them unless they are what key and the manifest say.
func check(dir string, b []byte, key Key) (Manifest, [][]byte, error) {
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return m, nil, fmt.Errorf("%w: its manifest cannot be read: %w", ErrCorrupt, err)
	}
	if m.Format != Format {
		return m, nil, fmt.Errorf("%w: manifest format %d, this worker reads %d", ErrMismatch, m.Format, Format)
	}
	if why := key.mismatch(m.Key); why != "" {
		return m, nil, fmt.Errorf("%w: %s", ErrMismatch, why)
	}
	states := make([][]byte, len(m.Slots))
	seen := map[int]bool{}
	for i, s := range m.Slots {
		switch {
		case s.Slot < 0 || s.Slot >= key.Slots || seen[s.Slot]:
			return m, nil, fmt.Errorf("%w: slot %d is not a slot of this worker or appears twice", ErrCorrupt, s.Slot)
		case len(s.Tokens) == 0 || len(s.Tokens) > key.CtxPerSlot:
			return m, nil, fmt.Errorf("%w: slot %d holds %d tokens, a slot has room for %d", ErrCorrupt, s.Slot, len(s.Tokens), key.CtxPerSlot)
		case filepath.Base(s.File) != s.File || s.File == manifestName:
			return m, nil, fmt.Errorf("%w: slot %d names the file %q", ErrCorrupt, s.Slot, s.File)
		}
		seen[s.Slot] = true
		data, err := readExactly(filepath.Join(dir, s.File), s.Bytes)
		if err != nil {
			return m, nil, fmt.Errorf("%w: slot %d: %w", ErrCorrupt, s.Slot, err)
		}
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != s.SHA256 {
			return m, nil, fmt.Errorf("%w: slot %d's file %s does not have the SHA-256 its manifest records", ErrCorrupt, s.Slot, s.File)
		}
		states[i] = data
	}
	return m, states, nil
}

// readExactly reads a file that must be n bytes long.
func readExactly(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() != n {
		return nil, fmt.Errorf("%s is %d bytes, its manifest says %d", filepath.Base(path), st.Size(), n)
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(f, data); err != nil {
		return nil, err
	}
	return data, nil
}
