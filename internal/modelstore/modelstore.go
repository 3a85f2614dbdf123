// Package modelstore manages a models directory: the GGUF files a hive can
// serve, each known by its ref, the file name without ".gguf"
// (<dir>/tiny.gguf is "tiny"). It lists them with what their headers say,
// and puts new ones in place atomically (Pull, WriteFile), checking them
// with the GGUF reader first so that the directory never holds a partial or
// foreign file under a model's name.
package modelstore

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/datadir"
	"github.com/apiary-llm/apiary/internal/gguf"
)

// Ext is the file name extension of models.
const Ext = ".gguf"

// Sentinel errors.
var (
	// ErrBadRef means a model name is not a valid ref.
	ErrBadRef = errors.New("invalid model name")
	// ErrExists means a model file is already there.
	ErrExists = errors.New("model already exists")
	// ErrNotFound means no model has the ref.
	ErrNotFound = errors.New("model not found")
)

// DefaultDir returns the default models directory: $XDG_DATA_HOME/apiary/models,
// or ~/.local/share/apiary/models when XDG_DATA_HOME is unset (the hive's
// default data directory, plus "models").
func DefaultDir() (string, error) {
	d, err := datadir.Home()
	if err != nil {
		return "", fmt.Errorf("no default models directory: %w", err)
	}
	return filepath.Join(d, "models"), nil
}

// CheckRef reports whether ref can name a model: 1 to 128 letters, digits,
// '.', '_' and '-', not starting with '.' or '-'.
func CheckRef(ref string) error {
	if ref == "" || len(ref) > 128 {
		return fmt.Errorf("%w %q: it must be 1 to 128 characters long", ErrBadRef, ref)
	}
	if ref[0] == '.' || ref[0] == '-' {
		return fmt.Errorf("%w %q: it must not start with %q", ErrBadRef, ref, ref[0])
	}
	for _, c := range ref {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%w %q: %q is not allowed (use letters, digits, '.', '_' and '-')", ErrBadRef, ref, c)
		}
	}
	return nil
}

// Path returns the path of the model ref in dir, whether or not it exists.
func Path(dir, ref string) (string, error) {
	if err := CheckRef(ref); err != nil {
		return "", err
	}
	return filepath.Join(dir, ref+Ext), nil
}

// Resolve returns the file a model reference names: a path to a GGUF file
// when it has a path separator or ends in ".gguf", otherwise the ref of a
// model in dir. The file must exist (ErrNotFound otherwise).
func Resolve(dir, refOrPath string) (string, error) {
	p := refOrPath
	if !strings.ContainsRune(refOrPath, filepath.Separator) && !strings.HasSuffix(refOrPath, Ext) {
		var err error
		if p, err = Path(dir, refOrPath); err != nil {
			return "", err
		}
	}
	st, err := os.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("%w: %s (no file %s)", ErrNotFound, refOrPath, p)
	case err != nil:
		return "", err
	case !st.Mode().IsRegular():
		return "", fmt.Errorf("%w: %s is not a regular file", ErrNotFound, p)
	}
	return p, nil
}

// Model is one model file of a models directory.
type Model struct {
	Ref     string     `json:"ref"`
	Path    string     `json:"path"`
	Size    int64      `json:"size_bytes"`
	ModTime time.Time  `json:"modified_at"`
	Info    *gguf.Info `json:"info,omitempty"`  // nil when the file could not be read
	Error   string     `json:"error,omitempty"` // why it could not be read
	// Projector is the model's vision projector, ProjectorPrefix+REF.gguf
	// beside it (what a worker of the model loads for images); "" when
	// it has none.
	Projector string `json:"projector,omitempty"`
}

// ProjectorPrefix starts the file name of a vision projector (llama.cpp's
// mmproj GGUF): mmproj-REF.gguf is model REF's. Such files are no models.
const ProjectorPrefix = "mmproj-"

// isProjector says whether a file name is a vision projector's (mmproj…,
// in any case): not a model of its own.
func isProjector(name string) bool {
	return len(name) >= len("mmproj") && strings.EqualFold(name[:len("mmproj")], "mmproj")
}

// List returns the models of dir sorted by ref: every *.gguf file (or
// symbolic link to one) whose name is a valid ref, a split model
// (NAME-00001-of-0000N.gguf …) once, by its first part, with the size of
// all. A file the GGUF reader rejects (truncated: shorter than its
// header's tensor data) or a split model that lacks a part is listed with
// its Error, not left out. Partial downloads (*.partial) are not models,
// nor are vision projectors (mmproj*.gguf): mmproj-REF.gguf is REF's
// Projector. A directory that does not exist holds no models.
func List(dir string) ([]Model, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var models []Model
	for _, e := range entries {
		ref, ok := strings.CutSuffix(e.Name(), Ext)
		if !ok || CheckRef(ref) != nil || isProjector(e.Name()) {
			continue // not a model, a temporary file of Pull or WriteFile, or a projector
		}
		m := Model{Ref: ref, Path: filepath.Join(dir, e.Name())}
		if proj := filepath.Join(dir, ProjectorPrefix+e.Name()); regularFile(proj) {
			m.Projector = proj
		}
		st, err := os.Stat(m.Path)
		if err != nil {
			m.Error = err.Error()
			models = append(models, m)
			continue
		}
		if st.IsDir() {
			continue
		}
		if sm := splitName.FindStringSubmatch(e.Name()); sm != nil && sm[2] != "00001" {
			continue // a later part of a split model: listed with its first
		}
		m.ModTime = st.ModTime()
		info, size, err := readInfo(m.Path)
		m.Size = size
		if err != nil {
			m.Error = describe(err)
		} else {
			m.Info = &info
		}
		models = append(models, m)
	}
	slices.SortFunc(models, func(a, b Model) int { return strings.Compare(a.Ref, b.Ref) })
	return models, nil
}

// regularFile says whether path is a regular file (or a link to one).
func regularFile(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

// ReadInfo reads what the header of the model at path says. For the
// first part of a split model (NAME-00001-of-0000N.gguf) it reads every
// part, which must be beside it: ParameterCount and WeightsBytes (and so
// the memory estimate) count the tensors of all the parts, not only the
// first's.
func ReadInfo(path string) (gguf.Info, error) {
	info, _, err := readInfo(path)
	return info, err
}

// readInfo is ReadInfo, with the bytes of all the model's files (those
// read so far on an error).
func readInfo(path string) (gguf.Info, int64, error) {
	st, err := os.Stat(path)
	if err != nil {
		return gguf.Info{}, 0, err
	}
	size := st.Size()
	f, err := gguf.Open(path)
	if err != nil {
		return gguf.Info{}, size, err
	}
	info := f.Info()
	rest := laterParts(path)
	n := len(rest) + 1
	for k, p := range rest {
		i, name := k+2, filepath.Base(p)
		part, err := gguf.Open(p)
		if errors.Is(err, fs.ErrNotExist) {
			return gguf.Info{}, size, fmt.Errorf("split model: part %d of %d (%s) is missing", i, n, name)
		} else if err != nil {
			return gguf.Info{}, size, fmt.Errorf("split model: part %d of %d: %s", i, n, describe(err))
		}
		st, err := os.Stat(p)
		if err != nil {
			return gguf.Info{}, size, err
		}
		size += st.Size()
		for _, t := range part.Tensors {
			info.ParameterCount += t.Elements
			info.WeightsBytes += t.Size
		}
	}
	return info, size, nil
}

// laterParts are the paths of a split model's parts after the first,
// in order, when path is the first part's (NAME-00001-of-0000N.gguf);
// none otherwise.
func laterParts(path string) []string {
	sm := splitName.FindStringSubmatch(filepath.Base(path))
	if sm == nil || sm[2] != "00001" {
		return nil
	}
	n, _ := strconv.Atoi(sm[3])
	var out []string
	for i := 2; i <= n; i++ {
		out = append(out, filepath.Join(filepath.Dir(path), fmt.Sprintf("%s-%05d-of-%s%s", sm[1], i, sm[3], Ext)))
	}
	return out
}

// describe returns what is wrong with a file, without its path when the
// error is the GGUF reader's (the listing shows the path already).
func describe(err error) string {
	if e, ok := errors.AsType[*gguf.Error](err); ok {
		return e.Msg
	}
	return err.Error()
}

// WriteFile puts a model at path atomically: write fills a temporary file
// in the same directory, which the GGUF reader must accept (and which must
// name its architecture) before it is moved to path. Unless overwrite is
// set, an existing file at path is ErrExists, checked before writing and
// again when moving. On any error the temporary file is removed and path is
// untouched. It returns the model's header.
func WriteFile(path string, overwrite bool, write func(w io.Writer) error) (*gguf.File, error) {
	if !overwrite {
		if _, err := os.Lstat(path); err == nil {
			return nil, fmt.Errorf("%w: %s", ErrExists, path)
		}
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.partial")
	if err != nil {
		if pe, ok := errors.AsType[*fs.PathError](err); ok {
			err = pe.Err // the temporary file's name would only confuse
		}
		return nil, fmt.Errorf("cannot write %s: %w", path, err)
	}
	placed := false
	defer func() {
		if !placed {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := write(tmp); err != nil {
		return nil, err
	}
	if err := tmp.Chmod(0o644); err != nil {
		return nil, err
	}
	if err := tmp.Sync(); err != nil {
		return nil, fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	f, err := Check(tmp.Name())
	if err != nil {
		return nil, err
	}
	if err := place(tmp.Name(), path, overwrite); err != nil {
		return nil, err
	}
	placed = true
	return f, nil
}

// Check reads the header of the model at path and checks that it names its
// architecture, as llama.cpp requires.
func Check(path string) (*gguf.File, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	if f.Architecture() == "" {
		return nil, &gguf.Error{Name: path, Msg: "no general.architecture in the metadata; llama.cpp cannot load it", Err: gguf.ErrInvalid}
	}
	return f, nil
}

// place moves tmp to path; unless overwrite, it fails with ErrExists if
// path exists, atomically where the file system has hard links.
func place(tmp, path string, overwrite bool) error {
	if overwrite {
		if err := os.Rename(tmp, path); err != nil {
			return err
		}
		return nil
	}
	err := os.Link(tmp, path)
	switch {
	case err == nil:
		os.Remove(tmp)
		return nil
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("%w: %s", ErrExists, path)
	}
	// No hard links here: check, then rename.
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("%w: %s", ErrExists, path)
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return nil
}
