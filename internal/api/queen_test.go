package api

import (
	"encoding/json"
	"testing"
)

// A keeper reads the lifecycle id of a queen that still says lifecycleId.
func TestAdminWorkerResponseReadsBothKeys(t *testing.T) {
	for _, body := range []string{
		`{"lifecycle_id":"wk-1","worker":{"id":"wk-1","pool_id":"p"}}`,
		`{"lifecycleId":"wk-1","worker":{"id":"wk-1","pool_id":"p"}}`,
	} {
		var r AdminWorkerResponse
		if err := json.Unmarshal([]byte(body), &r); err != nil || r.LifecycleID != "wk-1" || r.Worker.PoolID != "p" {
			t.Errorf("%s: %+v %v", body, r, err)
		}
	}
	b, _ := json.Marshal(AdminWorkerRequest{Action: ActionStop, LifecycleID: "wk-1", Reason: "r"})
	if want := `{"action":"stop","lifecycle_id":"wk-1","reason":"r"}`; string(b) != want {
		t.Errorf("request encodes as %s, want %s", b, want)
	}
}
