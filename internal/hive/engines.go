package hive

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/config"
	"github.com/apiary-llm/apiary/internal/gpu"
)

// EngineBuiltin is the engine every hive has: apiary's own worker
// (llama.cpp built in). It cannot be declared in an engines file.
const EngineBuiltin = "builtin"

// Engine is an external inference server the hive runs as a worker: its
// command line and environment (with placeholders, see Placeholders) and
// the path that answers 200 once it serves. It is supervised like the
// built-in worker: its own process group, the hive's parent-death signal,
// the port the hive allocated, its output in the worker log.
type Engine struct {
	// Command is the program and its arguments; required.
	Command []string `yaml:"command"`
	// Health is the path polled for readiness and health; default
	// /health.
	Health string `yaml:"health"`
	// Env is added to the engine's environment (the hive's own, less its
	// secrets).
	Env map[string]string `yaml:"env"`
}

// Placeholders are what an engine's command and env may contain, each
// replaced at spawn: the model file's path, the model's name (the file's
// name without .gguf: the "model" of every request the queen relays), the
// loopback host and port the engine must listen on, its context size,
// generation slots and CPU threads, the GPU's index and its UUID (both
// -1 on the CPU device, see gpuUUID), and a random key its front then
// sends as the bearer of every request (an engine whose command does not
// use {api_key} gets no bearer).
var Placeholders = []string{"model", "model_ref", "host", "port", "ctx_size", "slots", "threads", "gpu", "gpu_uuid", "gpu_uuids", "api_key"}

// CUDA numbers GPUs fastest first by default; NVML, which the hive's
// device indexes come from, by PCI bus. A process on a CUDA device gets
// cudaOrderPCI so that an index of the hive's names the same GPU in it
// (on a node of mixed GPU models the two orders differ).
const (
	cudaOrderKey = "CUDA_DEVICE_ORDER"
	cudaOrderPCI = cudaOrderKey + "=PCI_BUS_ID"
	// cudaVisibleKey: an engine split over several GPUs gets them, by
	// UUID, in CUDA_VISIBLE_DEVICES ({gpu_uuids}).
	cudaVisibleKey = "CUDA_VISIBLE_DEVICES"
)

// placeholderRE matches one placeholder: a name in braces.
var placeholderRE = regexp.MustCompile(`\{([A-Za-z0-9_]*)\}`)

// enginesFile is the engines file: a mapping of engine names.
type enginesFile struct {
	Engines map[string]Engine `yaml:"engines"`
}

// LoadEngines reads an engines file strictly (an unknown key is an error)
// and checks every engine; its errors name the file.
func LoadEngines(path string) (map[string]Engine, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("engines file: %w", err)
	}
	var f enginesFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("engines file %s: %w", path, config.YAMLError(err))
	}
	if err := checkEngines(f.Engines); err != nil {
		return nil, fmt.Errorf("engines file %s: %w", path, err)
	}
	return f.Engines, nil
}

// checkEngines reports every problem of the engines, by engine name.
func checkEngines(engines map[string]Engine) error {
	var p config.Problems
	for _, name := range slices.Sorted(maps.Keys(engines)) {
		e := engines[name]
		field := "engines." + name
		if name == EngineBuiltin {
			p.Add(field, "%q is the built-in engine; it cannot be redeclared", name)
		} else if err := api.CheckID("engine name", name); err != nil {
			p.Add(field, "%v", err)
		}
		if len(e.Command) == 0 || e.Command[0] == "" {
			p.Add(field+".command", "is empty: an engine needs a program to run")
		}
		for i, a := range e.Command {
			if u := unknownPlaceholders(a); len(u) > 0 {
				p.Add(fmt.Sprintf("%s.command[%d]", field, i), "unknown placeholder %s; the placeholders are %s", strings.Join(u, ", "), placeholderList())
			}
		}
		for _, k := range slices.Sorted(maps.Keys(e.Env)) {
			// The front passes the engine its env by name (--pass-env NAME,…).
			if k == "" || strings.ContainsAny(k, "=,*") || strings.ContainsFunc(k, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
				p.Add(field+".env", "%q is not a variable name", k)
			}
			if u := unknownPlaceholders(e.Env[k]); len(u) > 0 {
				p.Add(field+".env."+k, "unknown placeholder %s; the placeholders are %s", strings.Join(u, ", "), placeholderList())
			}
		}
		if e.Health != "" && !strings.HasPrefix(e.Health, "/") {
			p.Add(field+".health", "%q must be a path starting with /", e.Health)
		}
	}
	return p.Err()
}

func unknownPlaceholders(s string) []string {
	var out []string
	for _, m := range placeholderRE.FindAllStringSubmatch(s, -1) {
		if !slices.Contains(Placeholders, m[1]) {
			out = append(out, strconv.Quote(m[1]))
		}
	}
	return out
}

// placeholderList names the placeholders for a message (without their
// braces, which config.FieldError reads as field references).
func placeholderList() string { return strings.Join(Placeholders, ", ") }

// usesAPIKey says whether the engine's command or env asks for a bearer
// token.
func (e Engine) usesAPIKey() bool {
	for _, a := range e.Command {
		if strings.Contains(a, "{api_key}") {
			return true
		}
	}
	for _, v := range e.Env {
		if strings.Contains(v, "{api_key}") {
			return true
		}
	}
	return false
}

func (e Engine) healthPath() string {
	if e.Health == "" {
		return "/health"
	}
	return e.Health
}

// engineValues are the placeholders' values for one spawn. A zero
// ctx_size, slots or threads takes the built-in worker's default: 4096,
// 1, one thread per CPU.
func engineValues(model, modelRef, host string, port int, devs []gpu.Device, o startOptions, apiKey string) map[string]string {
	dev := devs[0]
	uuids := make([]string, len(devs))
	for i, d := range devs {
		uuids[i] = gpuUUID(d)
	}
	ctx, slots, threads := o.CtxSize, o.Slots, o.Threads
	if ctx <= 0 {
		ctx = 4096
	}
	if slots <= 0 {
		slots = 1
	}
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	return map[string]string{
		"model": model, "model_ref": modelRef, "host": host, "port": strconv.Itoa(port), "ctx_size": strconv.Itoa(ctx),
		"slots": strconv.Itoa(slots), "threads": strconv.Itoa(threads), "gpu": strconv.Itoa(workerDevice(dev)), "gpu_uuid": gpuUUID(dev),
		"gpu_uuids": strings.Join(uuids, ","), "api_key": apiKey,
	}
}

// gpuUUID is {gpu_uuid}: the device's UUID as NVML reports it
// ("GPU-…"), which CUDA_VISIBLE_DEVICES takes and which names one GPU
// whatever CUDA's order; the index where the driver reported no UUID;
// -1, which hides every GPU, on the CPU device.
func gpuUUID(d gpu.Device) string {
	if d.Kind == gpu.KindCUDA && d.UUID != "" {
		return d.UUID
	}
	return strconv.Itoa(workerDevice(d))
}

// expand replaces the placeholders of s with their values.
func expand(s string, vals map[string]string) string {
	return placeholderRE.ReplaceAllStringFunc(s, func(m string) string {
		if v, ok := vals[m[1:len(m)-1]]; ok {
			return v
		}
		return m
	})
}

// engineNames is the hive's engines, builtin first, the rest sorted.
func (h *Hive) engineNames() []string {
	return append([]string{EngineBuiltin}, slices.Sorted(maps.Keys(h.cfg.Engines))...)
}
