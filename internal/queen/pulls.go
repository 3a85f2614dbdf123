package queen

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/rpc"
	"github.com/apiary-llm/apiary/internal/store"
)

// HivePulls starts and reads model pulls on a hive (POST
// /v2/models/pull, GET /v2/models/pulls). The HTTP HiveClient implements
// it.
type HivePulls interface {
	PullModel(ctx context.Context, endpoint string, req api.PullModelRequest) (api.ModelPull, error)
	ModelPulls(ctx context.Context, endpoint string) ([]api.ModelPull, error)
}

// PullModel implements HivePulls.
func (c *httpHiveClient) PullModel(ctx context.Context, endpoint string, req api.PullModelRequest) (api.ModelPull, error) {
	var out api.ModelPull
	err := c.post(ctx, endpoint, "/v2/models/pull", req, &out)
	return out, err
}

// ModelPulls implements HivePulls.
func (c *httpHiveClient) ModelPulls(ctx context.Context, endpoint string) ([]api.ModelPull, error) {
	var list api.ModelPullList
	err := c.call(ctx, rpc.Call{URL: strings.TrimSuffix(endpoint, "/") + "/v2/models/pulls", Out: &list, MaxAnswer: maxHiveAnswer})
	return list.Pulls, err
}

func (q *Queen) hivePulls() HivePulls {
	if hp, ok := q.hives.(HivePulls); ok {
		return hp
	}
	return q.hivesHTTP
}

// pullPool returns the pool whose hive is asked about pulls: registered
// and answering (healthy or draining).
func (q *Queen) pullPool(poolID string) (registry.Pool, error) {
	if err := checkID("pool_id", poolID); err != nil {
		return registry.Pool{}, err
	}
	p, ok := q.reg.Get(poolID)
	if !ok {
		return registry.Pool{}, fmt.Errorf("%w: %s", registry.ErrNotFound, poolID)
	}
	if p.Status != registry.Healthy && p.Status != registry.Draining {
		return registry.Pool{}, fmt.Errorf("%w: pool %s is %s", ErrPoolUnavailable, p.ID, p.Status)
	}
	return p, nil
}

// PullModel asks the hive of pool poolID to pull a model in the
// background (its POST /v2/models/pull) and writes the audit entry
// model.pull_started with actor. The hive answers at once: an unknown
// repository or quantization, a gated repository or a model already there
// is its refusal (*HiveError with its status and code); a pull of the
// same model from the same ref under way is answered as it is. The hive reports the end (POST
// /v2/internal/models/pulls), audited as model.pulled or
// model.pull_failed, and the pool's model list is read again.
func (q *Queen) PullModel(ctx context.Context, poolID string, req api.PullModelRequest, actor string) (api.ModelPull, error) {
	pool, err := q.pullPool(poolID)
	if err != nil {
		return api.ModelPull{}, err
	}
	reason := req.Reason
	req.Reason = ""
	st, err := q.hivePulls().PullModel(ctx, pool.Endpoint, req)
	if err != nil {
		return api.ModelPull{}, fmt.Errorf("pull on pool %s: %w", poolID, err)
	}
	q.routing.PullStarted(poolID, st, actor, reason)
	controlPlane{q}.Audit(ctx, store.AuditEntry{TS: micro(time.Now()), Actor: actor, Action: "model.pull_started",
		Target: "model:" + st.Model, Reason: reason, Metadata: pullMeta(poolID, st)})
	q.log.Info("model pull started", "pool_id", poolID, "ref", req.Ref, "model_ref", st.Model, "pull_id", st.ID, "actor", actor)
	return st, nil
}

// ModelPulls returns the pulls the hive of pool poolID remembers.
func (q *Queen) ModelPulls(ctx context.Context, poolID string) ([]api.ModelPull, error) {
	pool, err := q.pullPool(poolID)
	if err != nil {
		return nil, err
	}
	pulls, err := q.hivePulls().ModelPulls(ctx, pool.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("pulls of pool %s: %w", poolID, err)
	}
	return pulls, nil
}

func pullMeta(poolID string, st api.ModelPull) map[string]any {
	m := map[string]any{"pool_id": poolID, "ref": st.Ref, "pull_id": st.ID, "model_ref": st.Model}
	if st.TotalBytes >= 0 {
		m["size_bytes"] = st.TotalBytes
	}
	return m
}

// postPoolPull serves POST /api/admin/pools/{id}/models/pull.
func (q *Queen) postPoolPull(w http.ResponseWriter, r *http.Request, c caller) error {
	var req api.PullModelRequest
	if err := api.Decode(r, &req, false); err != nil {
		return err
	}
	if req.Ref == "" {
		return api.BadRequest("ref is required (hf://ORG/REPO:QUANT, hf://ORG/REPO/FILE.gguf or an http(s) URL)")
	}
	if len(req.Ref) > 2048 {
		return api.BadRequest("ref is longer than 2048 bytes")
	}
	if req.Reason != "" {
		reason, err := checkReason(req.Reason)
		if err != nil {
			return err
		}
		req.Reason = reason
	}
	st, err := q.PullModel(r.Context(), r.PathValue("id"), req, c.actor)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusAccepted, st)
	return nil
}

// getPoolPulls serves GET /api/admin/pools/{id}/models/pulls.
func (q *Queen) getPoolPulls(w http.ResponseWriter, r *http.Request, _ caller) error {
	pulls, err := q.ModelPulls(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	if pulls == nil {
		pulls = []api.ModelPull{}
	}
	api.WriteJSON(w, http.StatusOK, api.ModelPullList{Pulls: pulls})
	return nil
}

// getPoolModels serves GET /api/admin/pools/models: every answering
// pool's models, read from its hive now.
func (q *Queen) getPoolModels(w http.ResponseWriter, r *http.Request, _ caller) error {
	if _, err := query(r); err != nil {
		return err
	}
	pools := q.routing.PoolModels(r.Context())
	for _, p := range pools {
		for i := range p.Models {
			if name := q.models.nameOf(p.Models[i].Ref); name != "" {
				p.Models[i].Names = []string{name}
			}
		}
	}
	api.WriteJSON(w, http.StatusOK, api.PoolModelsList{Pools: pools})
	return nil
}

// postPullReport serves POST /v2/internal/models/pulls: a hive says how
// a pull ended. It is audited (model.pulled or model.pull_failed, actor
// the pool), the pool's model list is read again, and routing learns the
// end (the controller places a worker of a model it pulled, or refuses
// the requests that waited for a pull that failed).
func (q *Queen) postPullReport(w http.ResponseWriter, r *http.Request, _ caller) error {
	var st api.ModelPull
	if err := api.Decode(r, &st, false); err != nil {
		return err
	}
	if err := checkID("pool_id", st.PoolID); err != nil {
		return err
	}
	if err := q.reg.CheckHolder(st.PoolID, hiveInstance(r)); err != nil {
		return err // a hive refused for the pool id: its pulls are not the pool's
	}
	pool, ok := q.reg.Get(st.PoolID)
	if !ok {
		return fmt.Errorf("%w: %s", registry.ErrNotFound, st.PoolID)
	}
	action := "model.pulled"
	switch st.State {
	case api.PullDone:
	case api.PullFailed:
		action = "model.pull_failed"
	default:
		return api.BadRequest("state %q: want %s or %s", st.State, api.PullDone, api.PullFailed)
	}
	if err := checkModel(st.Model); err != nil {
		return err
	}
	st.Ref = api.Printable(st.Ref, 2048)
	st.ID = api.Printable(st.ID, 64)
	meta := pullMeta(st.PoolID, st)
	reason := ""
	if st.Error != "" {
		reason = api.Printable(st.Error, 4*maxReasonLen)
	}
	controlPlane{q}.Audit(r.Context(), store.AuditEntry{TS: micro(time.Now()), Actor: "pool:" + st.PoolID, Action: action,
		Target: "model:" + st.Model, Reason: reason, Metadata: meta})
	q.log.Info("model pull ended", "pool_id", st.PoolID, "model_ref", st.Model, "state", st.State, "ref", st.Ref, "err", reason)
	st.PoolID = pool.ID
	q.routing.PullEnded(r.Context(), st)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// PullModel implements routing.ControlPlane: the controller's pull of a
// configured model that no pool has, as the queen's (audited
// model.pull_started with actor queen). A model the hive already has (409
// model_exists: the catalog was behind) is answered as pulled.
func (c controlPlane) PullModel(ctx context.Context, poolID string, req api.PullModelRequest) (api.ModelPull, error) {
	st, err := c.q.PullModel(ctx, poolID, req, registry.ActorQueen)
	var he *HiveError
	if errors.As(err, &he) && he.Code == "model_exists" {
		return api.ModelPull{PoolID: poolID, Ref: req.Ref, Model: req.Name, State: api.PullDone}, nil
	}
	return st, err
}

// maxPullReads bounds the hives asked at once for their pulls' progress.
const maxPullReads = 8

// addPulls adds to each of pools the pulls running there that the queen
// follows, with their progress read from the hive now (a hive that does
// not answer keeps the last known); only the pools with a pull are asked.
func (q *Queen) addPulls(ctx context.Context, pools []api.Pool) {
	running := q.routing.Pulls()
	if len(running) == 0 {
		return
	}
	ask := map[string]string{} // endpoint by pool id
	for _, p := range pools {
		for _, r := range running {
			if r.PoolID == p.PoolID {
				ask[p.PoolID] = p.Endpoint
			}
		}
	}
	var g errgroup.Group
	g.SetLimit(maxPullReads)
	for id, endpoint := range ask {
		g.Go(func() error {
			rctx, cancel := context.WithTimeout(ctx, q.cfg.HiveTimeout)
			defer cancel()
			list, err := q.hivePulls().ModelPulls(rctx, endpoint)
			if err != nil {
				q.log.Debug("cannot read a hive's pulls; showing the last known", "pool_id", id, "err", err)
				return nil
			}
			for _, mp := range list {
				mp.PoolID = id
				q.routing.PullProgress(mp)
			}
			return nil
		})
	}
	_ = g.Wait()
	running = q.routing.Pulls()
	for i := range pools {
		for _, r := range running {
			if r.PoolID == pools[i].PoolID {
				pools[i].Pulls = append(pools[i].Pulls, r.ModelPull)
			}
		}
	}
}
