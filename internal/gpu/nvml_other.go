//go:build !cgo || !linux

package gpu

import (
	"context"
	"errors"
	"fmt"
)

// NVML is unavailable in builds without cgo.
type NVML struct{}

// OpenNVML always reports ErrNoNVML: NVML needs cgo.
func OpenNVML() (*NVML, error) {
	return nil, fmt.Errorf("%w: built without cgo", ErrNoNVML)
}

// Devices is never reached.
func (*NVML) Devices(context.Context) ([]Device, error) { return nil, errors.New("gpu: no NVML") }

// Close does nothing.
func (*NVML) Close() error { return nil }
