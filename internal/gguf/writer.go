package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// Tensor is a tensor to write: its layout and its bytes.
type Tensor struct {
	Name  string
	Shape []uint64 // ggml order, see TensorInfo.Shape
	Type  GGMLType
	Data  []byte // exactly the size the shape and type need; unused by NewWriter
}

// Write writes a GGUF version 3 file holding md (in order) and tensors (in
// order, each at the next offset aligned to general.alignment from md, or
// DefaultAlignment). It checks everything the reader checks first, so it
// writes nothing when the input would not read back. Invalid input wraps
// ErrInvalid.
func Write(w io.Writer, md Metadata, tensors []Tensor) error {
	for i, t := range tensors {
		if err := checkData(i, t, t.Data); err != nil {
			return err
		}
	}
	tw, err := NewWriter(w, md, tensors)
	if err != nil {
		return err
	}
	for _, t := range tensors {
		if err := tw.WriteTensor(t.Data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// Writer writes a GGUF file one tensor at a time, so that a large model
// need not be in memory at once.
type Writer struct {
	e       *encoder
	tensors []Tensor // layouts; Data unused
	next    int      // index of the tensor WriteTensor writes next
	align   uint64
}

// NewWriter checks md and the tensors' layouts (their Data is not used),
// writes the header (metadata and tensor infos) to w and returns a Writer
// that takes the tensors' data in order. Invalid input wraps ErrInvalid and
// writes nothing.
func NewWriter(w io.Writer, md Metadata, tensors []Tensor) (*Writer, error) {
	align, err := checkWrite(md, tensors)
	if err != nil {
		return nil, err
	}
	e := &encoder{w: bufio.NewWriterSize(w, 1<<16)}
	e.bytes([]byte(Magic))
	e.u32(Version)
	e.u64(uint64(len(tensors)))
	e.u64(uint64(len(md)))
	for _, kv := range md {
		e.str(kv.Key)
		e.u32(uint32(kv.Value.typ))
		e.value(kv.Value)
	}
	var off uint64
	for _, t := range tensors {
		_, size, _ := tensorLayout(t.Shape, t.Type) // checked above
		e.str(t.Name)
		e.u32(uint32(len(t.Shape)))
		for _, d := range t.Shape {
			e.u64(d)
		}
		e.u32(uint32(t.Type))
		e.u64(off)
		off = alignUp(off+size, align)
	}
	e.pad(align)
	if e.err != nil {
		return nil, fmt.Errorf("write: %w", e.err)
	}
	return &Writer{e: e, tensors: tensors, align: align}, nil
}

// WriteTensor writes the data of the next tensor, which must be exactly
// the size its layout needs.
func (w *Writer) WriteTensor(data []byte) error {
	if w.next >= len(w.tensors) {
		return fmt.Errorf("%w: all %d tensors are written already", ErrInvalid, len(w.tensors))
	}
	if err := checkData(w.next, w.tensors[w.next], data); err != nil {
		return err
	}
	w.next++
	w.e.bytes(data)
	w.e.pad(w.align)
	if w.e.err != nil {
		return fmt.Errorf("write: %w", w.e.err)
	}
	return nil
}

// Close checks that every tensor was written and flushes the file. It does
// not close the underlying io.Writer.
func (w *Writer) Close() error {
	if w.next < len(w.tensors) {
		return fmt.Errorf("%w: %d of %d tensors written", ErrInvalid, w.next, len(w.tensors))
	}
	if w.e.err == nil {
		w.e.err = w.e.w.Flush()
	}
	if w.e.err != nil {
		return fmt.Errorf("write: %w", w.e.err)
	}
	return nil
}

// checkData checks that data is the size tensor i's layout needs.
func checkData(i int, t Tensor, data []byte) error {
	_, size, err := tensorLayout(t.Shape, t.Type)
	if err != nil {
		return fmt.Errorf("%w: tensor %d (%q): %w", ErrInvalid, i, t.Name, err)
	}
	if uint64(len(data)) != size {
		return fmt.Errorf("%w: tensor %d (%q): %d bytes of data, shape %v of type %s needs %d",
			ErrInvalid, i, t.Name, len(data), t.Shape, t.Type, size)
	}
	return nil
}

// checkWrite validates metadata and tensor layouts and returns the
// alignment.
func checkWrite(md Metadata, tensors []Tensor) (uint64, error) {
	keys := make(map[string]bool, len(md))
	for i, kv := range md {
		if keys[kv.Key] {
			return 0, fmt.Errorf("%w: metadata key %q appears twice", ErrInvalid, kv.Key)
		}
		keys[kv.Key] = true
		if kv.Value.x == nil {
			return 0, fmt.Errorf("%w: metadata entry %d (%q) has no value", ErrInvalid, i, kv.Key)
		}
	}
	align, err := alignmentOf(md)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	names := make(map[string]bool, len(tensors))
	for i, t := range tensors {
		if len(t.Name) > maxNameLen {
			return 0, fmt.Errorf("%w: tensor %d: name %q is longer than ggml's limit of %d bytes", ErrInvalid, i, t.Name, maxNameLen)
		}
		if names[t.Name] {
			return 0, fmt.Errorf("%w: tensor name %q appears twice", ErrInvalid, t.Name)
		}
		names[t.Name] = true
		if _, _, err := tensorLayout(t.Shape, t.Type); err != nil {
			return 0, fmt.Errorf("%w: tensor %d (%q): %w", ErrInvalid, i, t.Name, err)
		}
	}
	return align, nil
}

// encoder writes little-endian values, remembering the first error and the
// number of bytes written (for padding).
type encoder struct {
	w   *bufio.Writer
	n   uint64
	err error
	buf [8]byte
}

func (e *encoder) bytes(b []byte) {
	if e.err != nil {
		return
	}
	n, err := e.w.Write(b)
	e.n += uint64(n)
	e.err = err
}

func (e *encoder) u8(v uint8) { e.bytes([]byte{v}) }

func (e *encoder) u16(v uint16) {
	binary.LittleEndian.PutUint16(e.buf[:], v)
	e.bytes(e.buf[:2])
}

func (e *encoder) u32(v uint32) {
	binary.LittleEndian.PutUint32(e.buf[:], v)
	e.bytes(e.buf[:4])
}

func (e *encoder) u64(v uint64) {
	binary.LittleEndian.PutUint64(e.buf[:], v)
	e.bytes(e.buf[:8])
}

func (e *encoder) str(s string) {
	e.u64(uint64(len(s)))
	if e.err == nil {
		n, err := e.w.WriteString(s)
		e.n += uint64(n)
		e.err = err
	}
}

var zeros [4096]byte

func (e *encoder) pad(align uint64) {
	for n := alignUp(e.n, align) - e.n; n > 0 && e.err == nil; n = alignUp(e.n, align) - e.n {
		e.bytes(zeros[:min(n, uint64(len(zeros)))])
	}
}

func (e *encoder) value(v Value) {
	switch x := v.x.(type) {
	case uint8:
		e.u8(x)
	case int8:
		e.u8(uint8(x))
	case bool:
		e.u8(boolByte(x))
	case uint16:
		e.u16(x)
	case int16:
		e.u16(uint16(x))
	case uint32:
		e.u32(x)
	case int32:
		e.u32(uint32(x))
	case float32:
		e.u32(math.Float32bits(x))
	case uint64:
		e.u64(x)
	case int64:
		e.u64(uint64(x))
	case float64:
		e.u64(math.Float64bits(x))
	case string:
		e.str(x)
	default: // an array
		e.u32(uint32(v.elem))
		n := v.Len()
		e.u64(uint64(n))
		for i := range n {
			e.value(v.Index(i))
		}
	}
}

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}
