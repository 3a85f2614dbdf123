// Package modelconfig is the queen's config file of the cluster's models
// (apiary queen --config FILE): per model, the GGUF file that serves it,
// where it comes from, the names clients may use for it, how its workers
// start (context size, slots, threads, idle timeout), how many of them the
// queen keeps (min and max workers), where they may run (pools), and the
// sampling parameters a request gets when it does not set them.
//
// Parse decodes a file strictly (an unknown or repeated key is an error
// naming its path) and validates it, reporting every problem at once as
// config.FieldErrors whose field is the key's path in the file
// (models.qwen.ctx_size). A *File that Parse returned is valid and
// immutable: the queen swaps the whole file on a reload.
package modelconfig

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/config"
	"github.com/apiary-llm/apiary/internal/openai"
)

// MaxFileBytes bounds the file the queen reads.
const MaxFileBytes = 4 << 20

// Bounds of a model's worker settings.
const (
	MaxCtxSize = 1 << 21
	MaxSlots   = 1024
	MaxThreads = 4096
)

// EngineBuiltin is the engine every hive has: llama.cpp built in. Other
// engines are declared on the hives (their --engines file); a model
// names one, and only hives that have it run the model.
const EngineBuiltin = "builtin"

// File is the whole config file.
type File struct {
	// Models are the configured models, by name: the name clients send
	// as "model" (besides the model's aliases).
	Models map[string]Model `yaml:"models"`
	// Groups are sets of models that may share a device, by group name
	// (llama-swap's groups): a model of a group shares a device with the
	// models of its group and with models in no group, never with a
	// model of another group; a model of an exclusive group shares one
	// with its group only. Placement evicts idle workers to keep that
	// (see Apart).
	Groups map[string]Group `yaml:"groups"`

	byName  map[string]string // a model's name and each alias → the model's name
	byFile  map[string]string // a model's file → its name
	byGroup map[string]string // a model's name → its group's name
}

// Group is one entry of groups: the models (names or aliases) it holds.
type Group struct {
	Models []string `yaml:"models"`
	// Exclusive: a device that runs a model of the group runs no model
	// outside it, not even one in no group.
	Exclusive bool `yaml:"exclusive"`
}

// Model is one configured model. Zero fields mean the hive's or the
// queen's own default.
type Model struct {
	// Source is where the model's GGUF comes from: hf://ORG/REPO:QUANT,
	// hf://ORG/REPO/FILE.gguf, hf.co/ORG/REPO:QUANT (or …/FILE.gguf), or
	// an http(s) URL. Kept for pulls (see ParseSource); "" none.
	Source string `yaml:"source"`
	// File is the model ref that serves the model: the GGUF file name,
	// without .gguf, in the hives' models directory; default the model's
	// name.
	File string `yaml:"file"`
	// MMProj is the vision projector its workers load: a GGUF file name,
	// without .gguf, in the hives' models directory; default
	// mmproj-FILE.gguf beside the model when there is one.
	MMProj string `yaml:"mmproj"`
	// Engine names the hive engine that runs the model's workers;
	// default EngineBuiltin. The queen never holds a command: only hives
	// that declare the engine are placed on.
	Engine string `yaml:"engine"`
	// Aliases are more names clients may send for the model, e.g.
	// gpt-4o-mini; unique across the file, never another model's name.
	Aliases []string `yaml:"aliases"`
	// CtxSize, Slots and Threads are the workers' --ctx-size, --slots and
	// --threads; nil: the hive's --ctx-size, --worker-slots,
	// --worker-threads. Slots is also how many requests the queen sends
	// to one of its workers at once (default the queen's --worker-slots).
	CtxSize *int `yaml:"ctx_size"`
	Slots   *int `yaml:"slots"`
	Threads *int `yaml:"threads"`
	// MinWorkers and MaxWorkers are the model's replica settings: the
	// workers the queen keeps live with no request, and the most it
	// places. Set here, they replace apiary models scale for the model.
	MinWorkers *int `yaml:"min_workers"`
	MaxWorkers *int `yaml:"max_workers"`
	// IdleTimeout: the hive stops a worker of the model that served
	// nothing this long; default the hive's --idle-timeout.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// Pools are the pools the queen may place the model's workers on;
	// empty: any pool.
	Pools []string `yaml:"pools"`
	// Defaults are sampling parameters that a request for the model gets
	// when it does not set them.
	Defaults Defaults `yaml:"defaults"`
	// Pin keeps the model's workers from being evicted to make room for
	// another model's (they still stop when idle for idle_timeout).
	Pin bool `yaml:"pin"`
}

// Defaults are sampling parameters, with the OpenAI request's names and
// ranges; nil (empty) ones are not applied.
type Defaults struct {
	Temperature      *float64 `yaml:"temperature" json:"temperature,omitempty"`
	TopP             *float64 `yaml:"top_p" json:"top_p,omitempty"`
	TopK             *int     `yaml:"top_k" json:"top_k,omitempty"`
	MinP             *float64 `yaml:"min_p" json:"min_p,omitempty"`
	MaxTokens        *int     `yaml:"max_tokens" json:"max_tokens,omitempty"`
	PresencePenalty  *float64 `yaml:"presence_penalty" json:"presence_penalty,omitempty"`
	FrequencyPenalty *float64 `yaml:"frequency_penalty" json:"frequency_penalty,omitempty"`
	Seed             *int64   `yaml:"seed" json:"seed,omitempty"`
	Stop             []string `yaml:"stop" json:"stop,omitempty"`
}

// Empty reports whether d sets nothing.
func (d Defaults) Empty() bool {
	b, _ := json.Marshal(d)
	return string(b) == "{}"
}

// Load reads and parses the file at path.
func Load(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	data := make([]byte, MaxFileBytes+1)
	n, err := readFull(fh, data)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if n > MaxFileBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, MaxFileBytes)
	}
	return Parse(data[:n])
}

// Parse decodes data strictly and validates it: every problem at once,
// each a *config.FieldError named by its path in the file.
func Parse(data []byte) (*File, error) {
	var f File
	if err := decode(data, &f); err != nil {
		return nil, err
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	f.index()
	return &f, nil
}

// namePattern is what a model's name or alias may be: a model ref, and
// also ':' and '/' as in llama3.2:1b or meta-llama/Llama-3.2-1B.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+:/@-]*$`)

func checkName(s string) string {
	switch {
	case len(s) > api.MaxModelLen:
		return fmt.Sprintf("is %d bytes; a name has at most %d", len(s), api.MaxModelLen)
	case !namePattern.MatchString(s) || strings.Contains(s, ".."):
		return fmt.Sprintf("%q is not a model name: letters, digits, '.', '_', '+', ':', '/', '@', '-', starting with a letter or digit", api.Printable(s, 60))
	}
	return ""
}

// Validate reports every problem with f, by path in the file.
func (f *File) Validate() error {
	var p config.Problems
	names := slices.Sorted(maps.Keys(f.Models))
	files := map[string]string{}   // file → model
	aliases := map[string]string{} // alias → model
	for _, name := range names {
		m := f.Models[name]
		path := "models." + name
		if why := checkName(name); why != "" {
			p.Add(path, "%s", why)
		}
		file := m.file(name)
		if err := api.CheckModel(file); err != nil {
			p.Add(path+".file", "%q is not a model ref: a GGUF file name without .gguf (letters, digits, '.', '_', '+', '-')", api.Printable(file, 60))
		} else if other, ok := files[file]; ok {
			p.Add(path+".file", "is %q, which is already the file of models.%s: one model per file", file, other)
		} else {
			files[file] = name
		}
		if m.MMProj != "" {
			switch err := api.CheckModel(m.MMProj); {
			case err != nil:
				p.Add(path+".mmproj", "%q is not a file ref: a GGUF file name without .gguf (letters, digits, '.', '_', '+', '-')", api.Printable(m.MMProj, 60))
			case m.MMProj == file:
				p.Add(path+".mmproj", "is the model's own file %q: name its projector's file", file)
			case m.Engine != "" && m.Engine != EngineBuiltin:
				p.Add(path+".mmproj", "the engine %s gets no projector from the hive: give it in the engine's command", m.Engine)
			}
		}
		if m.Source != "" {
			if _, err := ParseSource(m.Source); err != nil {
				p.Add(path+".source", "%v", err)
			}
		}
		if m.Engine != "" {
			if err := api.CheckID("engine", m.Engine); err != nil {
				p.Add(path+".engine", "%v", err)
			}
		}
		for _, n := range []struct {
			key string
			v   *int
			max int
		}{{"ctx_size", m.CtxSize, MaxCtxSize}, {"slots", m.Slots, MaxSlots}, {"threads", m.Threads, MaxThreads}} {
			if n.v != nil && (*n.v < 1 || *n.v > n.max) {
				p.Add(path+"."+n.key, "must be from 1 to %d, got %d (leave it out for the hive's default)", n.max, *n.v)
			}
		}
		if m.MinWorkers != nil && (*m.MinWorkers < 0 || *m.MinWorkers > api.MaxReplicas) {
			p.Add(path+".min_workers", "must be from 0 to %d, got %d", api.MaxReplicas, *m.MinWorkers)
		}
		if m.MaxWorkers != nil {
			lo := 0
			if m.MinWorkers != nil {
				lo = max(*m.MinWorkers, 0)
			}
			if *m.MaxWorkers < lo || *m.MaxWorkers > api.MaxReplicas {
				p.Add(path+".max_workers", "must be from min_workers (%d) to %d, got %d", lo, api.MaxReplicas, *m.MaxWorkers)
			}
		}
		if m.IdleTimeout < 0 || (m.IdleTimeout > 0 && m.IdleTimeout < time.Second) {
			p.Add(path+".idle_timeout", "must be at least 1s, got %s (leave it out for the hive's --idle-timeout)", m.IdleTimeout)
		}
		seenPool := map[string]bool{}
		for i, pool := range m.Pools {
			key := fmt.Sprintf("%s.pools[%d]", path, i)
			if err := api.CheckID("pool id", pool); err != nil {
				p.Add(key, "%q is not a pool id", api.Printable(pool, 60))
			} else if seenPool[pool] {
				p.Add(key, "is %q again", pool)
			}
			seenPool[pool] = true
		}
		if err := m.Defaults.check(); err != nil {
			p.Add(path+".defaults", "%v", err)
		}
		for i, a := range m.Aliases {
			key := fmt.Sprintf("%s.aliases[%d]", path, i)
			if why := checkName(a); why != "" {
				p.Add(key, "%s", why)
				continue
			}
			_, isName := f.Models[a]
			switch other, dup := aliases[a]; {
			case a == name:
				p.Add(key, "is %q, the model's own name", a)
			case dup && other == name:
				p.Add(key, "is %q again", a)
			case dup:
				p.Add(key, "is %q, which is already an alias of models.%s", a, other)
			case isName:
				p.Add(key, "is %q, which is the name of models.%s", a, a)
			default:
				aliases[a] = name
			}
		}
	}
	// A name that is another model's file would name two things.
	for _, name := range names {
		if other, ok := files[name]; ok && other != name {
			p.Add("models."+name, "is the file of models.%s; name the model after its file, or give models.%s another file", other, other)
		}
	}
	f.validateGroups(&p, aliases)
	return p.Err()
}

// validateGroups checks groups: each names configured models (by name or
// alias), a model in one group at most.
func (f *File) validateGroups(p *config.Problems, aliases map[string]string) {
	member := map[string]string{} // model name → its group
	for _, g := range slices.Sorted(maps.Keys(f.Groups)) {
		path := "groups." + g
		if why := checkName(g); why != "" {
			p.Add(path, "%s", why)
		}
		if len(f.Groups[g].Models) == 0 {
			p.Add(path+".models", "names no model; list the models (their names in models) that may share a device")
		}
		for i, m := range f.Groups[g].Models {
			key := fmt.Sprintf("%s.models[%d]", path, i)
			name := m
			if a, ok := aliases[m]; ok {
				name = a
			}
			switch other, dup := member[name]; {
			case !hasModel(f.Models, name):
				p.Add(key, "is %q, which is not a model of models", api.Printable(m, 60))
			case dup && other == g:
				p.Add(key, "is %q again", m)
			case dup:
				p.Add(key, "is %q, which is already in groups.%s: a model is in one group at most", m, other)
			default:
				member[name] = g
			}
		}
	}
}

func hasModel(models map[string]Model, name string) bool {
	_, ok := models[name]
	return ok
}

// Apart says why a worker of model a and one of model b (names) may not
// share a device under groups; "" when they may.
func (f *File) Apart(a, b string) string {
	if f == nil || len(f.byGroup) == 0 {
		return ""
	}
	ga, gb := f.byGroup[a], f.byGroup[b]
	switch {
	case ga == gb:
		return ""
	case ga != "" && gb != "":
		return fmt.Sprintf("%s is in group %s and %s in group %s: models of two groups do not share a device", a, ga, b, gb)
	case ga != "" && f.Groups[ga].Exclusive:
		return fmt.Sprintf("%s is in group %s, which is exclusive: no model outside it shares its device", a, ga)
	case gb != "" && f.Groups[gb].Exclusive:
		return fmt.Sprintf("%s is in group %s, which is exclusive: no model outside it shares its device", b, gb)
	}
	return ""
}

// check validates d as a request's sampling parameters are validated.
func (d Defaults) check() error {
	b, err := json.Marshal(d)
	if err != nil {
		return err
	}
	body := `{"model":"m","prompt":"p"`
	if s := strings.TrimSuffix(strings.TrimPrefix(string(b), "{"), "}"); s != "" {
		body += "," + s
	}
	_, err = openai.DecodeCompletionRequest([]byte(body+"}"), openai.Limits{})
	if err != nil {
		return fmt.Errorf("%s", openai.AsError(err).Message)
	}
	return nil
}

func (m Model) file(name string) string {
	if m.File != "" {
		return m.File
	}
	return name
}

func (f *File) index() {
	f.byName = map[string]string{}
	f.byFile = map[string]string{}
	f.byGroup = map[string]string{}
	for name, m := range f.Models {
		m.File = m.file(name)
		m.Engine = cmpOr(m.Engine, EngineBuiltin)
		f.Models[name] = m
		f.byName[name] = name
		for _, a := range m.Aliases {
			f.byName[a] = name
		}
		f.byFile[m.File] = name
	}
	for g, grp := range f.Groups {
		for _, m := range grp.Models {
			f.byGroup[f.byName[m]] = g
		}
	}
}

// Resolve returns the configured model that name (a model's name or one
// of its aliases) names, with the model's name; ok false: no configured
// model has that name. A nil File resolves nothing.
func (f *File) Resolve(name string) (model string, m Model, ok bool) {
	if f == nil {
		return "", Model{}, false
	}
	model, ok = f.byName[name]
	if !ok {
		return "", Model{}, false
	}
	return model, f.Models[model], true
}

// ByFile returns the configured model whose file is ref, with its name.
func (f *File) ByFile(ref string) (model string, m Model, ok bool) {
	if f == nil {
		return "", Model{}, false
	}
	model, ok = f.byFile[ref]
	if !ok {
		return "", Model{}, false
	}
	return model, f.Models[model], true
}

// Names returns the configured models' names, sorted.
func (f *File) Names() []string {
	if f == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(f.Models))
}

// Diff says what changed from old to f, one line per model: "added
// models.x", "removed models.y", "changed models.z: ctx_size, aliases".
func (f *File) Diff(old *File) []string {
	var oldModels, newModels map[string]Model
	if old != nil {
		oldModels = old.Models
	}
	if f != nil {
		newModels = f.Models
	}
	var out []string
	for _, name := range slices.Sorted(maps.Keys(oldModels)) {
		if _, ok := newModels[name]; !ok {
			out = append(out, "removed models."+name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(newModels)) {
		o, ok := oldModels[name]
		if !ok {
			out = append(out, "added models."+name)
			continue
		}
		if keys := changedKeys(o, newModels[name]); len(keys) > 0 {
			out = append(out, "changed models."+name+": "+strings.Join(keys, ", "))
		}
	}
	var oldGroups, newGroups map[string]Group
	if old != nil {
		oldGroups = old.Groups
	}
	if f != nil {
		newGroups = f.Groups
	}
	if a, b := groupsJSON(oldGroups), groupsJSON(newGroups); a != b {
		out = append(out, "changed groups")
	}
	return out
}

func groupsJSON(g map[string]Group) string {
	if len(g) == 0 {
		return ""
	}
	b, _ := json.Marshal(g)
	return string(b)
}

// changedKeys names the keys whose values differ between a and b.
func changedKeys(a, b Model) []string {
	ja, jb := keyValues(a), keyValues(b)
	var out []string
	for _, k := range modelKeys {
		if ja[k] != jb[k] {
			out = append(out, k)
		}
	}
	return out
}

// keyValues is each key of m with its value as JSON.
func keyValues(m Model) map[string]string {
	out := map[string]string{}
	v := reflectFields(m)
	for k, val := range v {
		b, _ := json.Marshal(val)
		out[k] = string(b)
	}
	return out
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
