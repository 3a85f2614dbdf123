package queen

import (
	"net/http"
	"strings"
	"time"
	"unicode"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/store"
)

// Limits of the admin lists.
const (
	defaultListLimit = 100
	maxListLimit     = 10000
)

func (q *Queen) getWorkers(w http.ResponseWriter, r *http.Request, _ caller) error {
	qs, err := query(r, "status", "model", "pool_id", "limit")
	if err != nil {
		return err
	}
	var f store.RowFilter
	if s := qs["status"]; s != "" {
		for _, name := range strings.Split(s, ",") {
			st := lifecycle.Status(strings.ToUpper(strings.TrimSpace(name)))
			if !st.Valid() {
				return api.BadRequest("status %q is not a lifecycle status (STARTING, RUNNING, DRAINING, STOPPED, FAILED)", name)
			}
			f.Statuses = append(f.Statuses, st)
		}
	}
	if m := qs["model"]; m != "" {
		if err := checkModel(m); err != nil {
			return err
		}
		f.ModelRef = q.models.resolve(m) // a configured name or alias selects its model's file
	}
	if p := qs["pool_id"]; p != "" {
		if err := checkID("pool_id", p); err != nil {
			return err
		}
		f.PoolID = p
	}
	if f.Limit, err = parseLimit(qs["limit"], defaultListLimit, maxListLimit); err != nil {
		return err
	}
	var rows []store.Row
	if err := q.st.View(r.Context(), func(tx *store.Tx) (err error) { rows, err = tx.Rows(f); return err }); err != nil {
		return err
	}
	out := api.LifecycleRowList{Workers: make([]api.LifecycleRow, 0, len(rows))}
	for _, row := range rows {
		out.Workers = append(out.Workers, q.rowWire(row))
	}
	api.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (q *Queen) getWorker(w http.ResponseWriter, r *http.Request, _ caller) error {
	id := r.PathValue("id")
	if err := checkLifecycleID(id); err != nil {
		return err
	}
	row, err := q.rows.get(r.Context(), id)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, q.rowWire(row))
	return nil
}

func (q *Queen) postWorkers(w http.ResponseWriter, r *http.Request, c caller) error {
	var req api.AdminWorkerRequest
	if err := api.Decode(r, &req, false); err != nil {
		return err
	}
	reason, err := checkReason(req.Reason)
	if err != nil {
		return err
	}
	switch req.Action {
	case api.ActionStart, api.ActionCreate:
		if req.LifecycleID != "" || req.Drain {
			return api.BadRequest("lifecycle_id and drain belong to action stop")
		}
		switch {
		case req.Action == api.ActionStart && req.Placement != "":
			return api.BadRequest("placement belongs to action create")
		case req.Placement == api.PlacementOperator:
			// The row waits for a worker run by hand to claim it: no
			// pool, no device.
			if req.PoolID != "" || req.GPU != nil {
				return api.BadRequest("pool_id and gpu belong to placement %s: a row of placement %s is claimed by a worker run by hand wherever it runs",
					api.PlacementAuto, api.PlacementOperator)
			}
			if err := checkModel(req.Model); err != nil {
				return err
			}
			row, err := q.createOperatorRow(r.Context(), q.models.resolve(req.Model), reason, c.actor)
			if err != nil {
				return err
			}
			api.WriteJSON(w, http.StatusCreated, api.AdminWorkerResponse{LifecycleID: row.ID, Worker: q.rowWire(row)})
			return nil
		case req.Placement != "" && req.Placement != api.PlacementAuto:
			return api.BadRequest("placement %q: want %s or %s", req.Placement, api.PlacementAuto, api.PlacementOperator)
		}
		if err := checkModel(req.Model); err != nil {
			return err
		}
		if req.PoolID != "" {
			if err := checkID("pool_id", req.PoolID); err != nil {
				return err
			}
		}
		if req.GPU != nil && *req.GPU < 0 {
			return api.BadRequest("gpu %d is negative", *req.GPU)
		}
		// A configured name or alias starts a worker of its model's file.
		row, err := q.StartWorker(r.Context(), StartRequest{Model: q.models.resolve(req.Model), PoolID: req.PoolID, GPU: req.GPU,
			Reason: reason, Actor: c.actor, Owner: OwnerOperator})
		if err != nil {
			return err
		}
		api.WriteJSON(w, http.StatusCreated, api.AdminWorkerResponse{LifecycleID: row.ID, Worker: q.rowWire(row)})
	case api.ActionStop:
		if req.Model != "" || req.PoolID != "" || req.GPU != nil || req.Placement != "" {
			return api.BadRequest("model, pool_id, gpu and placement belong to action start or create")
		}
		if err := checkLifecycleID(req.LifecycleID); err != nil {
			return err
		}
		// The row says who stopped it; the audit entry has the actor.
		row, err := q.stopWorker(r.Context(), req.LifecycleID, stopOrder{drain: req.Drain, reason: reason, actor: c.actor, action: "worker.stop",
			rowReason: "stopped by " + c.actor + ": " + reason})
		if err != nil {
			return err
		}
		api.WriteJSON(w, http.StatusAccepted, api.AdminWorkerResponse{LifecycleID: row.ID, Worker: q.rowWire(row)})
	default:
		return api.BadRequest("action %q: want start or stop (or create)", req.Action)
	}
	return nil
}

func (q *Queen) getAudit(w http.ResponseWriter, r *http.Request, _ caller) error {
	qs, err := query(r, "since", "until", "limit", "actor", "target", "action")
	if err != nil {
		return err
	}
	var f store.AuditFilter
	now := time.Now()
	if s := qs["since"]; s != "" {
		if f.Since, err = parseSince(s, now); err != nil {
			return err
		}
	}
	if s := qs["until"]; s != "" {
		if f.Until, err = parseTime("until", s, now); err != nil {
			return err
		}
	}
	if a := qs["actor"]; a != "" {
		if len(a) > 300 || strings.IndexFunc(a, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
			return api.BadRequest("actor must be printable text of at most 300 bytes")
		}
		f.Actor = a
	}
	if f.Limit, err = parseLimit(qs["limit"], defaultListLimit, maxListLimit); err != nil {
		return err
	}
	if t := qs["target"]; t != "" {
		if len(t) > 300 {
			return api.BadRequest("target is longer than 300 bytes")
		}
		f.Target = t
	}
	if a := qs["action"]; a != "" {
		if err := checkID("action", a); err != nil {
			return err
		}
		f.Action = a
	}
	var entries []store.AuditEntry
	if err := q.st.View(r.Context(), func(tx *store.Tx) (err error) { entries, err = tx.Audit(f); return err }); err != nil {
		return err
	}
	out := api.AuditList{Entries: make([]api.AuditEntry, 0, len(entries))}
	for _, e := range entries {
		out.Entries = append(out.Entries, api.AuditEntry{ID: e.ID, TS: e.TS, Actor: e.Actor, Action: e.Action,
			Target: e.Target, Reason: e.Reason, Metadata: e.Metadata})
	}
	api.WriteJSON(w, http.StatusOK, out)
	return nil
}

// rowWire is a row as the admin API shows it. A live row's last heartbeat
// comes from memory (the store gets it every flush interval).
func (q *Queen) rowWire(r store.Row) api.LifecycleRow {
	if !r.Status.Terminal() {
		q.rows.mu.Lock()
		if at, ok := q.rows.seenAt(r.ID); ok {
			r.LastHeartbeatAt = &at
		}
		q.rows.mu.Unlock()
	}
	w := api.LifecycleRow{ID: r.ID, PoolID: r.PoolID, WorkerID: r.WorkerID, ModelRef: r.ModelRef, GPUDevice: r.GPUDevice,
		DeviceKind: q.deviceKind(r.PoolID, r.GPUDevice), Status: string(r.Status), Reason: r.Reason, CreatedAt: r.CreatedAt, StartedAt: r.StartedAt, ReadyAt: r.ReadyAt,
		StoppedAt: r.StoppedAt, LastHeartbeatAt: r.LastHeartbeatAt, VRAMBytes: r.VRAMBytes, URI: r.URI, PID: r.PID,
		ExitCode: r.ExitCode, Owner: r.Owner}
	w.ModelName = q.models.nameOf(r.ModelRef)
	if hw, ok := q.poolWorker(r.PoolID, r.WorkerID); ok {
		if len(hw.Devices) > 1 {
			w.GPUDevices = hw.DeviceIDs()
		}
		w.Pod, w.Node = hw.Pod, hw.Node
	}
	if r.Status == rowRunning && q.routing != nil {
		if s, ok := q.routing.Strikes(r.ID); ok {
			w.Strikes = &s
		}
	}
	return w
}

// poolWorker is worker workerID as its pool lists it; ok is false when
// the pool does not list it (any more).
func (q *Queen) poolWorker(poolID, workerID string) (api.Worker, bool) {
	if workerID == "" {
		return api.Worker{}, false
	}
	p, ok := q.reg.Get(poolID)
	if !ok {
		return api.Worker{}, false
	}
	for _, w := range p.Workers {
		if w.WorkerID == workerID {
			return w, true
		}
	}
	return api.Worker{}, false
}

// deviceKind is the kind of device dev of pool poolID (api.DeviceCPU or
// api.DeviceCUDA), "" when the pool or the device is not known: a CPU is
// device 0 of its pool's inventory, and must not read as a GPU.
func (q *Queen) deviceKind(poolID string, dev *int) string {
	if dev == nil {
		return ""
	}
	p, ok := q.reg.Get(poolID)
	if !ok {
		return ""
	}
	for _, g := range p.GPUs {
		if g.ID == *dev {
			return g.Kind
		}
	}
	return ""
}
