package queen

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/registry"
)

func TestPlacement(t *testing.T) {
	const gib = 1 << 30
	gpu := func(id int, free uint64) api.GPU { return api.GPU{ID: id, FreeBytes: free} }
	tiny := map[string]api.Model{"tiny": {Ref: "tiny", SizeBytes: 2 * gib}}
	pools := []registry.Pool{
		{ID: "a", Status: registry.Healthy, GPUs: []api.GPU{gpu(0, 10*gib)}},
		{ID: "b", Status: registry.Healthy, GPUs: []api.GPU{gpu(0, 5*gib), gpu(1, 30*gib)}},
		{ID: "c", Status: registry.Draining, GPUs: []api.GPU{gpu(0, 100*gib)}},
		{ID: "d", Status: registry.Healthy, GPUs: []api.GPU{gpu(0, 30*gib)}},
		{ID: "e", Status: registry.Healthy, GPUs: []api.GPU{gpu(0, 1*gib)}},
		{ID: "f", Status: registry.Healthy, GPUs: []api.GPU{gpu(0, 50*gib)}},
		{ID: "g", Status: registry.Healthy, GPUs: []api.GPU{gpu(0, 50*gib)}},
		{ID: "h", Status: registry.Unhealthy},
	}
	models := map[string]map[string]api.Model{"a": tiny, "b": tiny, "c": tiny, "d": tiny, "e": tiny,
		"f": {"other": {Ref: "other", SizeBytes: 1}}}
	one, zero := 1, 0
	for _, tc := range []struct {
		name     string
		gpu      *int
		exclude  map[string]string
		pools    []registry.Pool
		want     string
		wantGPU  int
		rejected []Rejection
	}{
		{name: "most free memory where the model fits, ties by id", pools: pools, want: "b", wantGPU: 1, rejected: []Rejection{
			{"c", "pool is draining"},
			{"e", "no device has room for tiny (2.0 GiB): the roomiest, device 0, has 1.0 GiB free"},
			{"f", "does not have model tiny"},
			{"g", "its model list is not known (the hive has not answered GET /v2/models)"},
			{"h", "pool is unhealthy"},
			{"a", "fits on device 0 with 10.0 GiB free; b has more (30.0 GiB on device 1, ties go to the smaller id)"},
			{"d", "fits on device 0 with 30.0 GiB free; b has more (30.0 GiB on device 1, ties go to the smaller id)"},
		}},
		{name: "on a given device", pools: pools[:5], gpu: &zero, want: "d", wantGPU: 0, rejected: []Rejection{
			{"c", "pool is draining"},
			{"e", "no device has room for tiny (2.0 GiB): the roomiest, device 0, has 1.0 GiB free"},
			{"a", "fits on device 0 with 10.0 GiB free; d has more (30.0 GiB on device 0, ties go to the smaller id)"},
			{"b", "fits on device 0 with 5.0 GiB free; d has more (30.0 GiB on device 0, ties go to the smaller id)"},
		}},
		{name: "a device only one pool has", pools: pools[:2], gpu: &one, want: "b", wantGPU: 1, rejected: []Rejection{
			{"a", "has no device 1"},
		}},
		{name: "an excluded pool is left out with its reason", pools: pools[:2], exclude: map[string]string{"b": "its hive refused the start"},
			want: "a", rejected: []Rejection{{"b", "its hive refused the start"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := MostFreeMemory{}.Place(tc.pools, PlaceRequest{Model: "tiny", GPU: tc.gpu, Models: models, Exclude: tc.exclude})
			if err != nil {
				t.Fatal(err)
			}
			if d.Pool.ID != tc.want || d.GPU != tc.wantGPU || d.NeedBytes != 2*gib {
				t.Errorf("placed on %s device %d (need %d), want %s device %d", d.Pool.ID, d.GPU, d.NeedBytes, tc.want, tc.wantGPU)
			}
			if diff := cmp.Diff(tc.rejected, d.Rejected); diff != "" {
				t.Errorf("rejections (-want +got):\n%s", diff)
			}
		})
	}

	t.Run("no pool: every pool's reason in the error", func(t *testing.T) {
		_, err := MostFreeMemory{}.Place(pools[2:3], PlaceRequest{Model: "tiny", Models: models})
		if !errors.Is(err, ErrNoPool) || err.Error() != "no pool can run tiny (c: pool is draining)" {
			t.Errorf("err %v", err)
		}
		if diff := cmp.Diff([]Rejection{{"c", "pool is draining"}}, placementRejections(err)); diff != "" {
			t.Errorf("rejections (-want +got):\n%s", diff)
		}
		_, err = MostFreeMemory{}.Place(nil, PlaceRequest{Model: "tiny"})
		if !errors.Is(err, ErrNoPool) || err.Error() != "no pool can run tiny: no hive has registered" {
			t.Errorf("no pools: %v", err)
		}
	})
}
