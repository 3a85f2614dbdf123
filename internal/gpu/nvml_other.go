//go:build !cgo || !linux

package gpu

import (
	"errors"
	"fmt"
)

// NVML is unavailable in builds without cgo.
type NVML struct{}

// OpenNVML always reports ErrNoNVML: NVML needs cgo.
func OpenNVML() (*NVML, error) {
	return nil, fmt.Errorf("%w: built without cgo", ErrNoNVML)
}

var errNoNVML = errors.New("no NVML")

// DeviceCount is never reached.
func (*NVML) DeviceCount() (int, error) { return 0, errNoNVML }

// Device is never reached.
func (*NVML) Device(int) (Device, error) { return Device{}, errNoNVML }

// CUDAVersion is never reached.
func (*NVML) CUDAVersion() (int, error) { return 0, errNoNVML }

// Processes is never reached.
func (*NVML) Processes(int) ([]Process, error) { return nil, errNoNVML }

// Close does nothing.
func (*NVML) Close() error { return nil }
