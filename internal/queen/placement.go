package queen

import (
	"fmt"
	"strings"

	"github.com/apiary-llm/apiary/internal/registry"
)

// PlaceRequest is what a placement must satisfy.
type PlaceRequest struct {
	Model string
	GPU   *int // a device the worker must run on
}

// Placer picks the pool a new worker goes to. It is pure: it decides from
// the pools it is given. (Issue 5's demand-driven placement replaces the
// default with one that knows the models and memory estimates.)
type Placer interface {
	Place(pools []registry.Pool, req PlaceRequest) (registry.Pool, error)
}

// MostFreeMemory places on the healthy pool whose roomiest device (or the
// requested one) has the most free memory; ties go to the smaller id.
type MostFreeMemory struct{}

// Place implements Placer.
func (MostFreeMemory) Place(pools []registry.Pool, req PlaceRequest) (registry.Pool, error) {
	var best registry.Pool
	var bestFree uint64
	found := false
	var rejected []string
	for _, p := range pools {
		if p.Status != registry.Healthy {
			rejected = append(rejected, fmt.Sprintf("%s is %s", p.ID, p.Status))
			continue
		}
		free := p.MaxFreeBytes()
		if req.GPU != nil {
			ok := false
			for _, g := range p.GPUs {
				if g.ID == *req.GPU {
					free, ok = g.FreeBytes, true
				}
			}
			if !ok {
				rejected = append(rejected, fmt.Sprintf("%s has no device %d", p.ID, *req.GPU))
				continue
			}
		}
		if !found || free > bestFree || (free == bestFree && p.ID < best.ID) {
			best, bestFree, found = p, free, true
		}
	}
	if !found {
		if len(rejected) == 0 {
			return registry.Pool{}, fmt.Errorf("%w: no hive has registered", ErrNoPool)
		}
		return registry.Pool{}, fmt.Errorf("%w: %s", ErrNoPool, strings.Join(rejected, "; "))
	}
	return best, nil
}
