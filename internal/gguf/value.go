package gguf

import (
	"fmt"
	"math"
)

// ValueType is the type tag of a metadata value, as stored in the file.
type ValueType uint32

// Metadata value types of GGUF v3.
const (
	TypeUint8   ValueType = 0
	TypeInt8    ValueType = 1
	TypeUint16  ValueType = 2
	TypeInt16   ValueType = 3
	TypeUint32  ValueType = 4
	TypeInt32   ValueType = 5
	TypeFloat32 ValueType = 6
	TypeBool    ValueType = 7
	TypeString  ValueType = 8
	TypeArray   ValueType = 9
	TypeUint64  ValueType = 10
	TypeInt64   ValueType = 11
	TypeFloat64 ValueType = 12
)

var valueTypeNames = [...]string{
	TypeUint8:   "uint8",
	TypeInt8:    "int8",
	TypeUint16:  "uint16",
	TypeInt16:   "int16",
	TypeUint32:  "uint32",
	TypeInt32:   "int32",
	TypeFloat32: "float32",
	TypeBool:    "bool",
	TypeString:  "string",
	TypeArray:   "array",
	TypeUint64:  "uint64",
	TypeInt64:   "int64",
	TypeFloat64: "float64",
}

func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return fmt.Sprintf("ValueType(%d)", uint32(t))
}

// valid reports whether t is a type the format defines.
func (t ValueType) valid() bool { return t <= TypeFloat64 }

// size is the encoded size of a scalar of type t; 0 for strings and arrays,
// whose size depends on their content.
func (t ValueType) size() int {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return 8
	}
	return 0
}

// minSize is the fewest bytes an encoded value of type t can take; it bounds
// element counts by the bytes left in a file before anything is allocated.
func (t ValueType) minSize() int {
	switch t {
	case TypeString:
		return 8 // the length prefix
	case TypeArray:
		return 12 // element type and count
	}
	return t.size()
}

// Value is one metadata value: a scalar, a string or an array of either.
// The zero Value is invalid; build values with the constructors (Uint32,
// String, Array, …) or read them from a file.
type Value struct {
	typ  ValueType
	elem ValueType // element type, when typ is TypeArray
	x    any       // the Go value: uint8 … float64, bool, string, or a slice of one of them
}

// Constructors of scalar values.
func Uint8(v uint8) Value     { return Value{typ: TypeUint8, x: v} }
func Int8(v int8) Value       { return Value{typ: TypeInt8, x: v} }
func Uint16(v uint16) Value   { return Value{typ: TypeUint16, x: v} }
func Int16(v int16) Value     { return Value{typ: TypeInt16, x: v} }
func Uint32(v uint32) Value   { return Value{typ: TypeUint32, x: v} }
func Int32(v int32) Value     { return Value{typ: TypeInt32, x: v} }
func Float32(v float32) Value { return Value{typ: TypeFloat32, x: v} }
func Bool(v bool) Value       { return Value{typ: TypeBool, x: v} }
func String(v string) Value   { return Value{typ: TypeString, x: v} }
func Uint64(v uint64) Value   { return Value{typ: TypeUint64, x: v} }
func Int64(v int64) Value     { return Value{typ: TypeInt64, x: v} }
func Float64(v float64) Value { return Value{typ: TypeFloat64, x: v} }

// Elem is the set of Go types an array value can hold. GGUF has no arrays
// of arrays that llama.cpp accepts, so neither does this package.
type Elem interface {
	uint8 | int8 | uint16 | int16 | uint32 | int32 | float32 | bool | string | uint64 | int64 | float64
}

// Array returns an array value holding vs (not a copy).
func Array[T Elem](vs []T) Value {
	return Value{typ: TypeArray, elem: elemType(vs), x: vs}
}

func elemType(x any) ValueType {
	switch x.(type) {
	case []uint8:
		return TypeUint8
	case []int8:
		return TypeInt8
	case []uint16:
		return TypeUint16
	case []int16:
		return TypeInt16
	case []uint32:
		return TypeUint32
	case []int32:
		return TypeInt32
	case []float32:
		return TypeFloat32
	case []bool:
		return TypeBool
	case []string:
		return TypeString
	case []uint64:
		return TypeUint64
	case []int64:
		return TypeInt64
	case []float64:
		return TypeFloat64
	}
	panic(fmt.Sprintf("gguf: no array element type for %T", x))
}

// Type returns the value's type tag.
func (v Value) Type() ValueType { return v.typ }

// ElemType returns the element type of an array value.
func (v Value) ElemType() ValueType { return v.elem }

// Interface returns the Go value: one of uint8 … float64, bool and string
// for scalars, a slice of one of them for arrays (not a copy), nil for the
// zero Value.
func (v Value) Interface() any { return v.x }

// AsString returns a string value.
func (v Value) AsString() (string, bool) {
	s, ok := v.x.(string)
	return s, ok
}

// AsBool returns a bool value.
func (v Value) AsBool() (bool, bool) {
	b, ok := v.x.(bool)
	return b, ok
}

// AsUint returns an integer value of any width that is not negative.
func (v Value) AsUint() (uint64, bool) {
	switch x := v.x.(type) {
	case uint8:
		return uint64(x), true
	case uint16:
		return uint64(x), true
	case uint32:
		return uint64(x), true
	case uint64:
		return x, true
	}
	if i, ok := v.AsInt(); ok && i >= 0 {
		return uint64(i), true
	}
	return 0, false
}

// AsInt returns an integer value of any width that fits in an int64.
func (v Value) AsInt() (int64, bool) {
	switch x := v.x.(type) {
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case uint64:
		if x <= math.MaxInt64 {
			return int64(x), true
		}
	}
	return 0, false
}

// AsFloat returns a float32 or float64 value.
func (v Value) AsFloat() (float64, bool) {
	switch x := v.x.(type) {
	case float32:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

// AsStrings returns an array of strings (not a copy).
func (v Value) AsStrings() ([]string, bool) {
	s, ok := v.x.([]string)
	return s, ok
}

// AsUints returns an array of non-negative integers of any width, converted.
func (v Value) AsUints() ([]uint64, bool) {
	if v.typ != TypeArray {
		return nil, false
	}
	out := make([]uint64, v.Len())
	for i := range out {
		u, ok := v.Index(i).AsUint()
		if !ok {
			return nil, false
		}
		out[i] = u
	}
	return out, true
}

// Len returns the number of elements of an array value, 0 for scalars.
func (v Value) Len() int {
	switch x := v.x.(type) {
	case []uint8:
		return len(x)
	case []int8:
		return len(x)
	case []uint16:
		return len(x)
	case []int16:
		return len(x)
	case []uint32:
		return len(x)
	case []int32:
		return len(x)
	case []float32:
		return len(x)
	case []bool:
		return len(x)
	case []string:
		return len(x)
	case []uint64:
		return len(x)
	case []int64:
		return len(x)
	case []float64:
		return len(x)
	}
	return 0
}

// Index returns element i of an array value as a scalar Value. It panics
// if v is not an array or i is out of range, like a slice index.
func (v Value) Index(i int) Value {
	switch x := v.x.(type) {
	case []uint8:
		return Uint8(x[i])
	case []int8:
		return Int8(x[i])
	case []uint16:
		return Uint16(x[i])
	case []int16:
		return Int16(x[i])
	case []uint32:
		return Uint32(x[i])
	case []int32:
		return Int32(x[i])
	case []float32:
		return Float32(x[i])
	case []bool:
		return Bool(x[i])
	case []string:
		return String(x[i])
	case []uint64:
		return Uint64(x[i])
	case []int64:
		return Int64(x[i])
	case []float64:
		return Float64(x[i])
	}
	panic(fmt.Sprintf("gguf: Index of a %s value", v.typ))
}

// String formats the value for people: scalars as Go formats them, strings
// quoted, arrays summarised by element type and length.
func (v Value) String() string {
	switch x := v.x.(type) {
	case nil:
		return "<invalid>"
	case string:
		return fmt.Sprintf("%q", x)
	}
	if v.typ == TypeArray {
		return fmt.Sprintf("[%d]%s", v.Len(), v.elem)
	}
	return fmt.Sprint(v.x)
}

// KV is one metadata key and its value.
type KV struct {
	Key   string
	Value Value
}

// Metadata is the ordered list of key-value pairs of a file.
type Metadata []KV

// Lookup returns the value of key.
func (m Metadata) Lookup(key string) (Value, bool) {
	for _, kv := range m {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return Value{}, false
}

// String returns the value of key if it is a string, "" otherwise.
func (m Metadata) String(key string) string {
	v, _ := m.Lookup(key)
	s, _ := v.AsString()
	return s
}

// Uint returns the value of key if it is a non-negative integer, 0 otherwise.
func (m Metadata) Uint(key string) uint64 {
	v, _ := m.Lookup(key)
	u, _ := v.AsUint()
	return u
}

// Float returns the value of key if it is a float, 0 otherwise.
func (m Metadata) Float(key string) float64 {
	v, _ := m.Lookup(key)
	f, _ := v.AsFloat()
	return f
}
