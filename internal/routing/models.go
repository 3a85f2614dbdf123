package routing

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/apiary-llm/apiary/internal/modelconfig"
	"github.com/apiary-llm/apiary/internal/openai"
)

// SetModels takes the queen's model config (nil: none): from now on a
// request naming a configured model or alias goes to the model's file
// with its sampling defaults, /v1/models lists the names and aliases,
// placement keeps to each model's pools, and the router sends each of its
// workers up to the model's slots. Waiting requests and the controller
// look again at once.
func (s *Service) SetModels(f *modelconfig.File) {
	s.models.Store(f)
	s.Poke()
}

// modelFile returns the config's model whose file is ref, if any.
func (s *Service) modelFile(ref string) (modelconfig.Model, bool) {
	_, m, ok := s.models.Load().ByFile(ref)
	return m, ok
}

// resolved is a request's model after the config: the model ref that
// serves it, and the configured model when it is one.
type resolved struct {
	ref        string
	configured bool
	model      modelconfig.Model
}

// resolve maps the model a request names to the model ref that serves
// it: a configured name or alias to its model's file, anything else to
// itself.
func (s *Service) resolve(name string) resolved {
	_, m, ok := s.models.Load().Resolve(name)
	if !ok {
		return resolved{ref: name}
	}
	return resolved{ref: m.File, configured: true, model: m}
}

// slotsOf is how many requests the router sends one worker of model at
// once: its config's slots, else WorkerSlots.
func (s *Service) slotsOf(model string) int {
	if m, ok := s.modelFile(model); ok && m.Slots != nil {
		return *m.Slots
	}
	return s.cfg.WorkerSlots
}

// allowedPools is the pools model may be placed on (its config's pools);
// nil: any.
func (s *Service) allowedPools(model string) []string {
	if m, ok := s.modelFile(model); ok && len(m.Pools) > 0 {
		return m.Pools
	}
	return nil
}

// engineOf is the hive engine that runs model (its config's engine);
// "" for the built-in one.
func (s *Service) engineOf(model string) string {
	if m, ok := s.modelFile(model); ok && m.Engine != modelconfig.EngineBuiltin {
		return m.Engine
	}
	return ""
}

// rewriteBody returns body for the worker: "model" set to the model ref
// that serves it, and each of the model's sampling defaults that the
// request does not set added. A body that needs neither is returned as it
// came. max_tokens is not added to a chat request that sets
// max_completion_tokens (its other name).
func rewriteBody(body []byte, name string, r resolved) ([]byte, error) {
	if !r.configured || (name == r.ref && r.model.Defaults.Empty()) {
		return body, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return nil, &openai.Error{Status: http.StatusBadRequest, Code: openai.CodeInvalidJSON, Message: "the body is not a JSON object: " + err.Error(), Err: openai.ErrInvalidRequest}
	}
	ref, err := json.Marshal(r.ref)
	if err != nil {
		return nil, err
	}
	fields["model"] = ref
	d, err := json.Marshal(r.model.Defaults)
	if err != nil {
		return nil, err
	}
	var defaults map[string]json.RawMessage
	if err := json.Unmarshal(d, &defaults); err != nil {
		return nil, err
	}
	for k, v := range defaults {
		if cur, ok := fields[k]; ok && string(cur) != "null" {
			continue
		}
		if _, ok := fields["max_completion_tokens"]; ok && k == "max_tokens" {
			continue
		}
		fields[k] = v
	}
	out, err := json.Marshal(fields)
	if err != nil {
		return nil, fmt.Errorf("the request with its defaults: %w", err)
	}
	return out, nil
}

// configuredModels is the /v1/models entries of the config: each model's
// name, and each alias saying which model it is an alias of.
func (s *Service) configuredModels() []openai.Model {
	f := s.models.Load()
	var out []openai.Model
	for _, name := range f.Names() {
		m := f.Models[name]
		out = append(out, openai.Model{ID: name, Object: openai.ObjectModel, OwnedBy: "apiary"})
		for _, a := range m.Aliases {
			out = append(out, openai.Model{ID: a, Object: openai.ObjectModel, OwnedBy: "apiary", AliasOf: name})
		}
	}
	return out
}

// pinned says whether model's workers are kept from eviction (its
// config's pin).
func (s *Service) pinned(model string) bool {
	m, ok := s.modelFile(model)
	return ok && m.Pin
}

// apartFrom is the placement's Apart for a worker of model: why it may
// not share a device with a worker of another model under the config's
// groups; nil when the config has none.
func (s *Service) apartFrom(model string) func(other string) string {
	f := s.models.Load()
	if f == nil || len(f.Groups) == 0 {
		return nil
	}
	// A model the config does not name is in no group: a name no
	// configured model can have (names start with a letter or digit).
	name := func(ref string) string {
		if n, _, ok := f.ByFile(ref); ok {
			return n
		}
		return " " + ref
	}
	self := name(model)
	return func(other string) string {
		return f.Apart(self, name(other))
	}
}

// nameOf is the name a user gave the model whose file is ref in the
// config (ref itself when no configured model has it).
func (s *Service) nameOf(ref string) string {
	if name, _, ok := s.models.Load().ByFile(ref); ok {
		return name
	}
	return ref
}
