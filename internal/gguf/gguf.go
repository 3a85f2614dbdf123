// Package gguf reads and writes GGUF files, the model format of llama.cpp.
//
// A GGUF file (versions 2 and 3, little-endian) is laid out as
//
//	magic "GGUF" | uint32 version | uint64 tensor count | uint64 metadata count
//	metadata: string key, uint32 value type, value          (repeated)
//	tensor infos: string name, uint32 n_dims, uint64 dims[n_dims],
//	              uint32 ggml type, uint64 offset            (repeated)
//	padding to general.alignment (default 32)
//	tensor data, each tensor at its offset from the start of this section,
//	padded to the alignment
//
// where a string is a uint64 byte length followed by the bytes, and an
// array value is a uint32 element type, a uint64 count and the elements.
//
// The reader treats the file as untrusted: every count and length is
// checked against the bytes left in the file before anything is allocated,
// and a truncated, corrupt or foreign file is an *Error naming the file,
// the place and what is wrong, never a panic. It accepts the files llama.cpp
// accepts and rejects, with a reason, the ones it refuses.
package gguf

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// Magic is the first four bytes of every GGUF file.
const Magic = "GGUF"

// Version is the format version the writer produces.
const Version = 3

// DefaultAlignment is the alignment of the tensor data when the file has no
// general.alignment key.
const DefaultAlignment = 32

// KeyAlignment is the metadata key that sets the tensor data alignment.
const KeyAlignment = "general.alignment"

// maxDims is ggml's GGML_MAX_DIMS.
const maxDims = 4

// maxNameLen is the longest tensor name llama.cpp accepts (GGML_MAX_NAME
// is 64 bytes including the terminating NUL).
const maxNameLen = 63

// Sentinel errors; an *Error wraps one of them (or an I/O error), so
// callers tell the cases apart with errors.Is.
var (
	// ErrNotGGUF means the file does not start with the GGUF magic.
	ErrNotGGUF = errors.New("not a GGUF file")
	// ErrVersion means the file is GGUF, but of a version or byte order
	// this package does not read.
	ErrVersion = errors.New("unsupported GGUF version")
	// ErrTruncated means the file ends before the data it declares.
	ErrTruncated = errors.New("file is truncated")
	// ErrInvalid means the file breaks the format: a length larger than the
	// file, an unknown type, a duplicate key or tensor, a misplaced tensor.
	ErrInvalid = errors.New("invalid file")
)

// Error describes what is wrong with a GGUF file and where.
type Error struct {
	Name   string // the file's path; empty when read with Read
	Offset int64  // byte offset at which the problem was found
	Msg    string // what is wrong, for people
	Err    error  // ErrNotGGUF, ErrVersion, ErrTruncated, ErrInvalid or an I/O error
}

func (e *Error) Error() string {
	if e.Name == "" {
		return "GGUF file: " + e.Msg
	}
	return e.Name + ": " + e.Msg
}

func (e *Error) Unwrap() error { return e.Err }

// File is the parsed header of a GGUF file: its metadata and the layout of
// its tensors. It holds no tensor data; read that from the file with
// TensorData.
type File struct {
	Version    uint32       // 2 or 3
	Metadata   Metadata     // in file order
	Tensors    []TensorInfo // in file order
	Alignment  uint64       // of the tensor data section and of each tensor
	DataOffset int64        // where the tensor data section starts
	Size       int64        // the file's size in bytes
}

// TensorInfo describes one tensor.
type TensorInfo struct {
	Name string
	// Shape in ggml order: Shape[0] is the number of columns (elements in a
	// row, contiguous in memory), Shape[1] the number of rows, and so on.
	Shape    []uint64
	Type     GGMLType
	Offset   uint64 // from File.DataOffset
	Size     uint64 // bytes
	Elements uint64 // product of Shape
}

// Open reads the header of the GGUF file at path. Errors about the content
// are *Error values that name the file.
func Open(path string) (*File, error) {
	st, err := os.Stat(path) // before opening: opening a FIFO would block
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, &Error{Name: path, Msg: "not a regular file", Err: ErrNotGGUF}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	gf, err := Read(f, st.Size())
	if err != nil {
		if e, ok := errors.AsType[*Error](err); ok {
			e.Name = path
		}
		return nil, err
	}
	return gf, nil
}

// Read reads the header of a GGUF file of size bytes from r. Errors about
// the content are *Error values.
func Read(r io.ReaderAt, size int64) (*File, error) {
	return decode(r, size)
}

// Tensor returns the tensor called name.
func (f *File) Tensor(name string) (TensorInfo, bool) {
	for _, t := range f.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return TensorInfo{}, false
}

// TensorData returns a reader of tensor t's bytes in r, the file f was read
// from.
func (f *File) TensorData(r io.ReaderAt, t TensorInfo) *io.SectionReader {
	return io.NewSectionReader(r, f.DataOffset+int64(t.Offset), int64(t.Size))
}

// Architecture returns general.architecture, e.g. "llama"; empty if unset.
func (f *File) Architecture() string {
	return f.Metadata.String("general.architecture")
}

// errorf builds an *Error at offset off.
func errorf(kind error, off int64, format string, a ...any) *Error {
	return &Error{Offset: off, Msg: fmt.Sprintf(format, a...), Err: kind}
}
