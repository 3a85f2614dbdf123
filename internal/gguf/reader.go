package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
)

// Smallest encodings, used to bound counts by the bytes left in the file.
const (
	minKVSize     = 8 + 4 + 1     // empty key, type, one-byte value
	minTensorSize = 8 + 4 + 4 + 8 // empty name, no dims, type, offset
)

// MaxHeaderSize bounds the metadata and tensor infos, whatever the file's
// size: real models need a few MiB (their tokenizer mostly), and the bound
// keeps a lying length in a large file from costing gigabytes of memory.
const MaxHeaderSize = 1 << 30

// growCap caps the capacity reserved up front for a list whose length the
// file declares, so that allocation follows the entries actually read.
const growCap = 1 << 16

// decoder reads a GGUF header sequentially, keeping track of the offset so
// that every length can be checked against what is left of the file.
type decoder struct {
	r     *bufio.Reader
	off   int64  // bytes consumed so far
	size  int64  // the file's size
	where string // what is being read, for error messages
}

func decode(r io.ReaderAt, size int64) (*File, error) {
	if size < 0 {
		return nil, errorf(ErrInvalid, 0, "negative file size %d", size)
	}
	d := &decoder{r: bufio.NewReaderSize(io.NewSectionReader(r, 0, size), 1<<16), size: size, where: "header"}
	f := &File{Size: size, Alignment: DefaultAlignment}
	if err := d.header(f); err != nil {
		return nil, err
	}
	return f, nil
}

func (d *decoder) left() int64 { return d.size - d.off }

// next returns the next n bytes (n ≤ the buffer size); the slice is valid
// until the next read.
func (d *decoder) next(n int) ([]byte, error) {
	b, err := d.r.Peek(n)
	if len(b) < n {
		return nil, d.readErr(err)
	}
	d.r.Discard(n) // cannot fail after a successful Peek
	d.off += int64(n)
	return b, nil
}

// readErr turns a failed read into an *Error: the end of the data is a
// truncation, anything else an I/O error.
func (d *decoder) readErr(err error) error {
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, bufio.ErrBufferFull) {
		return errorf(ErrTruncated, d.off, "truncated in %s (file ends at byte %d)", d.where, d.size)
	}
	return &Error{Offset: d.off, Msg: fmt.Sprintf("reading %s at byte %d: %v", d.where, d.off, err), Err: err}
}

func (d *decoder) u32() (uint32, error) {
	b, err := d.next(4)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

func (d *decoder) u64() (uint64, error) {
	b, err := d.next(8)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

// str reads a length-prefixed string.
func (d *decoder) str() (string, error) {
	n, err := d.u64()
	if err != nil {
		return "", err
	}
	if err := d.fits("string length", n, 1); err != nil {
		return "", err
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(d.r, buf); err != nil {
		return "", d.readErr(err)
	}
	d.off += int64(n)
	return string(buf), nil
}

// count reads an element count and checks that count elements of at least
// minSize bytes each fit in the rest of the file.
func (d *decoder) count(what string, minSize int) (uint64, error) {
	n, err := d.u64()
	if err != nil {
		return 0, err
	}
	return n, d.fits(what, n, uint64(minSize))
}

// fits checks, before anything is allocated, that n items of at least
// minSize bytes each, whose count or length (what) was just read, fit in
// the rest of the file and within MaxHeaderSize.
func (d *decoder) fits(what string, n, minSize uint64) error {
	at := d.off - 8
	hi, need := bits.Mul64(n, minSize)
	if hi != 0 || need > uint64(d.left()) {
		return errorf(ErrInvalid, at, "%s: %s %d exceeds the %d bytes left in the file", d.where, what, n, d.left())
	}
	if uint64(d.off)+need > MaxHeaderSize {
		return errorf(ErrInvalid, at, "%s: %s %d would make the header larger than %d bytes", d.where, what, n, MaxHeaderSize)
	}
	return nil
}

func (d *decoder) header(f *File) error {
	b, err := d.r.Peek(len(Magic))
	if string(b) != Magic {
		switch {
		case len(b) < len(Magic) && int64(len(b)) < d.size:
			return d.readErr(err) // an I/O error, not the end of the file
		case d.size == 0:
			return errorf(ErrNotGGUF, 0, "not a GGUF file (empty)")
		}
		return errorf(ErrNotGGUF, 0, "not a GGUF file (magic %q)", b)
	}
	d.next(len(Magic)) // peeked above
	v, err := d.u32()
	if err != nil {
		return err
	}
	switch {
	case v == 2 || v == 3:
		f.Version = v
	case v == 1:
		return errorf(ErrVersion, 4, "GGUF version 1 is not supported (versions 2 and 3 are); convert the model again with a current llama.cpp")
	case bits.ReverseBytes32(v) >= 1 && bits.ReverseBytes32(v) <= 3:
		return errorf(ErrVersion, 4, "big-endian GGUF file (version %d) is not supported", bits.ReverseBytes32(v))
	default:
		return errorf(ErrVersion, 4, "GGUF version %d is not supported (versions 2 and 3 are)", v)
	}
	nTensors, err := d.count("tensor count", minTensorSize)
	if err != nil {
		return err
	}
	nKV, err := d.count("metadata count", minKVSize)
	if err != nil {
		return err
	}
	// Both fit separately; together they must too (no overflow: each
	// product is at most the file size).
	if nTensors*minTensorSize+nKV*minKVSize > uint64(d.left()) {
		return errorf(ErrInvalid, 8, "header: %d tensors and %d metadata entries need more than the %d bytes left in the file", nTensors, nKV, d.left())
	}
	if err := d.metadata(f, nKV); err != nil {
		return err
	}
	if f.Alignment, err = alignmentOf(f.Metadata); err != nil {
		return errorf(ErrInvalid, 0, "%v", err)
	}
	if err := d.tensorInfos(f, nTensors); err != nil {
		return err
	}
	return d.dataSection(f)
}

func (d *decoder) metadata(f *File, n uint64) error {
	f.Metadata = make(Metadata, 0, min(n, growCap))
	seen := make(map[string]int, min(n, growCap))
	for i := range n {
		d.where = fmt.Sprintf("metadata entry %d", i)
		key, err := d.str()
		if err != nil {
			return err
		}
		if j, dup := seen[key]; dup {
			return errorf(ErrInvalid, d.off, "metadata entries %d and %d have the same key %q", j, i, key)
		}
		seen[key] = int(i)
		d.where = fmt.Sprintf("metadata entry %d (%q)", i, key)
		t, err := d.u32()
		if err != nil {
			return err
		}
		v, err := d.value(ValueType(t))
		if err != nil {
			return err
		}
		f.Metadata = append(f.Metadata, KV{Key: key, Value: v})
	}
	return nil
}

// value reads a value of type t.
func (d *decoder) value(t ValueType) (Value, error) {
	if t == TypeArray {
		return d.array()
	}
	if !t.valid() {
		return Value{}, errorf(ErrInvalid, d.off-4, "%s: unknown value type %d", d.where, uint32(t))
	}
	if t == TypeString {
		s, err := d.str()
		return String(s), err
	}
	b, err := d.next(t.size())
	if err != nil {
		return Value{}, err
	}
	return scalar(t, b), nil
}

// scalar decodes a fixed-size value of type t from b.
func scalar(t ValueType, b []byte) Value {
	le := binary.LittleEndian
	switch t {
	case TypeUint8:
		return Uint8(b[0])
	case TypeInt8:
		return Int8(int8(b[0]))
	case TypeUint16:
		return Uint16(le.Uint16(b))
	case TypeInt16:
		return Int16(int16(le.Uint16(b)))
	case TypeUint32:
		return Uint32(le.Uint32(b))
	case TypeInt32:
		return Int32(int32(le.Uint32(b)))
	case TypeFloat32:
		return Float32(math.Float32frombits(le.Uint32(b)))
	case TypeBool:
		return Bool(b[0] != 0)
	case TypeUint64:
		return Uint64(le.Uint64(b))
	case TypeInt64:
		return Int64(int64(le.Uint64(b)))
	case TypeFloat64:
		return Float64(math.Float64frombits(le.Uint64(b)))
	}
	panic("gguf: scalar of type " + t.String())
}

func (d *decoder) array() (Value, error) {
	et, err := d.u32()
	if err != nil {
		return Value{}, err
	}
	t := ValueType(et)
	switch {
	case t == TypeArray:
		return Value{}, errorf(ErrInvalid, d.off-4, "%s: arrays of arrays are not supported", d.where)
	case !t.valid():
		return Value{}, errorf(ErrInvalid, d.off-4, "%s: unknown array element type %d", d.where, et)
	}
	n, err := d.count(fmt.Sprintf("array length (of %s)", t), t.minSize())
	if err != nil {
		return Value{}, err
	}
	switch t {
	case TypeString:
		return readStrings(d, n)
	case TypeUint8:
		return readFixed(d, n, 1, func(b []byte) uint8 { return b[0] })
	case TypeInt8:
		return readFixed(d, n, 1, func(b []byte) int8 { return int8(b[0]) })
	case TypeBool:
		return readFixed(d, n, 1, func(b []byte) bool { return b[0] != 0 })
	case TypeUint16:
		return readFixed(d, n, 2, binary.LittleEndian.Uint16)
	case TypeInt16:
		return readFixed(d, n, 2, func(b []byte) int16 { return int16(binary.LittleEndian.Uint16(b)) })
	case TypeUint32:
		return readFixed(d, n, 4, binary.LittleEndian.Uint32)
	case TypeInt32:
		return readFixed(d, n, 4, func(b []byte) int32 { return int32(binary.LittleEndian.Uint32(b)) })
	case TypeFloat32:
		return readFixed(d, n, 4, func(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) })
	case TypeUint64:
		return readFixed(d, n, 8, binary.LittleEndian.Uint64)
	case TypeInt64:
		return readFixed(d, n, 8, func(b []byte) int64 { return int64(binary.LittleEndian.Uint64(b)) })
	default: // TypeFloat64
		return readFixed(d, n, 8, func(b []byte) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(b)) })
	}
}

// readFixed reads n elements of size bytes each, decoding each with dec.
// The slice grows as elements arrive, so a count that lies costs no more
// memory than the elements really there.
func readFixed[T Elem](d *decoder, n uint64, size int, dec func([]byte) T) (Value, error) {
	out := make([]T, 0, min(n, growCap))
	for range n {
		b, err := d.next(size)
		if err != nil {
			return Value{}, err
		}
		out = append(out, dec(b))
	}
	return Array(out), nil
}

func readStrings(d *decoder, n uint64) (Value, error) {
	out := make([]string, 0, min(n, growCap))
	for range n {
		s, err := d.str()
		if err != nil {
			return Value{}, err
		}
		out = append(out, s)
	}
	return Array(out), nil
}

// alignmentOf returns the alignment md sets with general.alignment, which
// must be a power of two stored as a uint32 (llama.cpp reads it as one).
func alignmentOf(md Metadata) (uint64, error) {
	v, ok := md.Lookup(KeyAlignment)
	if !ok {
		return DefaultAlignment, nil
	}
	a, isU32 := v.Interface().(uint32)
	if !isU32 {
		return 0, fmt.Errorf("%s is a %s, want uint32", KeyAlignment, v.Type())
	}
	if a == 0 || a&(a-1) != 0 {
		return 0, fmt.Errorf("%s is %d, not a power of two", KeyAlignment, a)
	}
	return uint64(a), nil
}

func (d *decoder) tensorInfos(f *File, n uint64) error {
	f.Tensors = make([]TensorInfo, 0, min(n, growCap))
	seen := make(map[string]int, min(n, growCap))
	for i := range n {
		d.where = fmt.Sprintf("tensor info %d", i)
		start := d.off
		name, err := d.str()
		if err != nil {
			return err
		}
		if len(name) > maxNameLen {
			return errorf(ErrInvalid, start, "%s: name is %d bytes, longer than ggml's limit of %d", d.where, len(name), maxNameLen)
		}
		if j, dup := seen[name]; dup {
			return errorf(ErrInvalid, start, "tensor infos %d and %d have the same name %q", j, i, name)
		}
		seen[name] = int(i)
		d.where = fmt.Sprintf("tensor info %d (%q)", i, name)
		nDims, err := d.u32()
		if err != nil {
			return err
		}
		if nDims > maxDims {
			return errorf(ErrInvalid, d.off-4, "%s: %d dimensions, more than ggml's %d", d.where, nDims, maxDims)
		}
		shape := make([]uint64, nDims)
		for j := range shape {
			if shape[j], err = d.u64(); err != nil {
				return err
			}
		}
		typ, err := d.u32()
		if err != nil {
			return err
		}
		off, err := d.u64()
		if err != nil {
			return err
		}
		elems, size, err := tensorLayout(shape, GGMLType(typ))
		if err != nil {
			return errorf(ErrInvalid, start, "%s: %v", d.where, err)
		}
		f.Tensors = append(f.Tensors, TensorInfo{
			Name: name, Shape: shape, Type: GGMLType(typ), Offset: off, Size: size, Elements: elems,
		})
	}
	return nil
}

// dataSection places the tensor data: it starts at the first aligned offset
// after the tensor infos, and each tensor follows the previous one, padded
// to the alignment, as llama.cpp requires. All of it must be in the file.
func (d *decoder) dataSection(f *File) error {
	f.DataOffset = int64(alignUp(uint64(d.off), f.Alignment))
	if f.DataOffset > f.Size {
		return errorf(ErrTruncated, f.Size, "truncated in the padding before the tensor data, which starts at byte %d (file ends at byte %d)",
			f.DataOffset, f.Size)
	}
	var want uint64 // expected offset of the next tensor
	for i, t := range f.Tensors {
		if t.Offset != want {
			return errorf(ErrInvalid, f.DataOffset, "tensor %d (%q) has data offset %d, want %d (tensors are stored in order, each padded to %d bytes)",
				i, t.Name, t.Offset, want, f.Alignment)
		}
		end, carry := bits.Add64(uint64(f.DataOffset)+t.Offset, t.Size, 0) // the first sum is ≤ 2·(size+alignment)
		if carry != 0 || end > uint64(f.Size) {
			return errorf(ErrTruncated, f.Size, "truncated in the data of tensor %d (%q): it ends at byte %d, the file at byte %d",
				i, t.Name, end, f.Size)
		}
		want = alignUp(t.Offset+t.Size, f.Alignment)
	}
	return nil
}

func alignUp(n, a uint64) uint64 {
	return (n + a - 1) &^ (a - 1)
}
