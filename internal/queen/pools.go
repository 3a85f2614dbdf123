package queen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/store"
	"github.com/apiary-llm/apiary/internal/transport"
)

// checkGPUs and checkWorker validate what a hive reports. They run on
// every heartbeat: the names in their errors are formatted only when
// there is an error.
func checkGPUs(gpus []api.GPU) error {
	if len(gpus) > maxGPUs {
		return api.BadRequest("%d gpus: at most %d", len(gpus), maxGPUs)
	}
	for i, g := range gpus {
		gpus[i].Name = api.Printable(g.Name, 256) // shown in tables
		gpus[i].Unusable = api.Printable(g.Unusable, 4*maxReasonLen)
		if g.ID < 0 {
			return api.BadRequest("gpu id %d is negative", g.ID)
		}
		if g.FreeBytes > g.TotalBytes && g.TotalBytes > 0 {
			return api.BadRequest("gpu %d reports more free memory (%d) than total (%d)", g.ID, g.FreeBytes, g.TotalBytes)
		}
		if hasControl(g.Kind) {
			return checkText(fmt.Sprintf("gpu %d kind", g.ID), g.Kind)
		}
		if hasControl(g.UUID) {
			return checkText(fmt.Sprintf("gpu %d uuid", g.ID), g.UUID)
		}
		for _, id := range g.Workers {
			if checkID("gpu worker", id) != nil {
				return checkID(fmt.Sprintf("gpu %d worker", g.ID), id)
			}
		}
	}
	return nil
}

// checkText refuses a control character (C0, DEL or C1: what terminal
// escape sequences are made of) in a name a hive reports: the queen shows
// it again, and `apiary pools` prints it on a terminal.
func checkText(what, s string) error {
	if hasControl(s) {
		return api.BadRequest("%s %q contains a control character", what, s)
	}
	return nil
}

func hasControl(s string) bool { return strings.IndexFunc(s, unicode.IsControl) >= 0 }

func checkWorker(w api.Worker) error { return checkWorkerURIs(w, nil) }

// checkWorkerURIs is checkWorker with the URIs a heartbeat stream's
// earlier beats carried that passed the check (nil: none): a worker's
// URI comes every second, and parsing it again was the largest
// allocation of a full beat.
func checkWorkerURIs(w api.Worker, uris *uriMemo) error {
	if err := checkID("worker_id", w.WorkerID); err != nil {
		return err
	}
	if w.LifecycleID != "" {
		if err := checkID("lifecycle_id", w.LifecycleID); err != nil {
			return err
		}
	}
	if _, err := lifecycle.ParseState(w.Status); err != nil {
		return api.BadRequest("worker %s: %v", w.WorkerID, err)
	}
	if w.ModelRef != "" {
		if err := checkModel(w.ModelRef); err != nil {
			return err
		}
	}
	if w.URI != "" && !uris.has(w.URI) {
		// The queen will send prompts and the worker's token there.
		if _, err := transport.CheckBaseURL("worker "+w.WorkerID+" uri", w.URI); err != nil {
			return api.BadRequest("%v", err)
		}
		uris.add(w.URI)
	}
	if len(w.Reason) > 4*maxReasonLen {
		return api.BadRequest("worker %s: reason is longer than %d bytes", w.WorkerID, 4*maxReasonLen)
	}
	// The lifecycle row keeps these in 32-bit INTEGER columns.
	if w.PID < 0 || w.PID > math.MaxInt32 {
		return api.BadRequest("worker %s: pid %d is out of range (0 to %d)", w.WorkerID, w.PID, math.MaxInt32)
	}
	if w.GPUDevice < 0 || w.GPUDevice > math.MaxInt32 {
		return api.BadRequest("worker %s: gpu_device %d is out of range (0 to %d)", w.WorkerID, w.GPUDevice, math.MaxInt32)
	}
	if c := w.ExitCode; c != nil && (*c < math.MinInt32 || *c > math.MaxInt32) {
		return api.BadRequest("worker %s: exit_code %d is out of range (a 32-bit integer)", w.WorkerID, *c)
	}
	for _, t := range w.History {
		if _, err := lifecycle.ParseState(t.To); err != nil || t.From != "" && !lifecycle.State(t.From).Valid() {
			return api.BadRequest("worker %s: history entry %q → %q is not between lifecycle states", w.WorkerID, t.From, t.To)
		}
	}
	return nil
}

// sanitizeWorkers keeps the free text a hive reports (reasons) to
// printable text: it reaches logs, the audit log and terminals. The queen
// keeps no history of a hive's worker (its rows have their own); a hive
// may still send one, which is checked and dropped.
func sanitizeWorkers(ws []api.Worker) {
	for i := range ws {
		ws[i].Reason = api.Printable(ws[i].Reason, 4*maxReasonLen)
		ws[i].History = nil
	}
}

// maxMaxLoaded bounds a registration's max_loaded (the hive's own bound).
const maxMaxLoaded = 10000

func (q *Queen) postRegister(w http.ResponseWriter, r *http.Request, c caller) error {
	var reg api.RegisterPool
	if err := api.Decode(r, &reg, false); err != nil {
		return err
	}
	if err := checkID("pool_id", reg.PoolID); err != nil {
		return err
	}
	if reg.PoolID == HandRunPool {
		return api.BadRequest("pool_id %q is reserved for the workers run by hand; give the hive another --pool-id", HandRunPool)
	}
	if reg.NodeID != "" {
		if err := checkID("node_id", reg.NodeID); err != nil {
			return err
		}
	}
	if _, err := transport.CheckBaseURL("endpoint", reg.Endpoint); err != nil {
		return api.BadRequest("%v", err)
	}
	if len(reg.Version) > 128 {
		return api.BadRequest("version is longer than 128 bytes")
	}
	if err := checkText("version", reg.Version); err != nil {
		return err
	}
	if err := checkGPUs(reg.GPUs); err != nil {
		return err
	}
	if reg.MaxLoaded < 0 || reg.MaxLoaded > maxMaxLoaded {
		return api.BadRequest("max_loaded must be from 0 (no limit) to %d, got %d", maxMaxLoaded, reg.MaxLoaded)
	}
	if reg.Instance != "" {
		if err := checkID("instance", reg.Instance); err != nil {
			return err
		}
	}
	// Another live hive holding the pool id refuses it (409
	// pool_id_in_use, naming the holder): see registry.Register.
	p, err := q.reg.Register(r.Context(), reg, "hive:"+reg.PoolID)
	if err != nil {
		return err
	}
	q.metrics.registrations.Inc()
	q.routing.Registered(p.ID, p.Endpoint)
	out := []api.Pool{poolWire(p)}
	q.addPulls(r.Context(), out)
	api.WriteJSON(w, http.StatusOK, out[0])
	return nil
}

func (q *Queen) postHeartbeat(w http.ResponseWriter, r *http.Request, c caller) error {
	id := r.PathValue("id")
	if err := checkID("pool id", id); err != nil {
		return err
	}
	var hb api.Heartbeat
	if err := api.Decode(r, &hb, false); err != nil {
		return err
	}
	ans, err := q.takeBeat(r.Context(), id, hiveInstance(r), hb, nil)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, ans)
	return nil
}

// beatStream is what a heartbeat stream keeps from beat to beat: the
// arrays it decodes the next beat into (see registry.Spares) and the
// worker URIs its beats carried that passed the check.
type beatStream struct {
	spares registry.Spares
	uris   uriMemo
}

func (st *beatStream) sparesOf() *registry.Spares {
	if st == nil {
		return nil
	}
	return &st.spares
}

func (st *beatStream) uriMemo() *uriMemo {
	if st == nil {
		return nil
	}
	return &st.uris
}

// uriMemo holds up to maxURIMemo worker URIs that passed the check
// (a pool's workers: most have a few).
type uriMemo struct{ ok []string }

const maxURIMemo = 64

func (m *uriMemo) has(uri string) bool { return m != nil && slices.Contains(m.ok, uri) }

func (m *uriMemo) add(uri string) {
	if m != nil && len(m.ok) < maxURIMemo {
		m.ok = append(m.ok, uri)
	}
}

// hiveInstance is the hive process a hive's call comes from (its
// api.HiveInstanceHeader; "" from an older hive).
func hiveInstance(r *http.Request) string { return r.Header.Get(api.HiveInstanceHeader) }

// takeBeat takes one heartbeat of pool id from hive instance, whether it
// came alone (POST /v2/pools/{id}/heartbeat, st nil) or on the pool's
// heartbeat stream (st is the stream's: the arrays nothing holds after
// this beat are put into its spares). A hive that no longer holds the pool
// is refused (409): its beats would mark the holder's workers lost.
func (q *Queen) takeBeat(ctx context.Context, id, instance string, hb api.Heartbeat, st *beatStream) (api.HeartbeatAnswer, error) {
	start := time.Now()
	defer func() { q.metrics.heartbeatSeconds.Observe(time.Since(start).Seconds()) }()
	q.metrics.heartbeats.Inc()
	if err := q.reg.CheckHolder(id, instance); err != nil {
		return api.HeartbeatAnswer{}, err
	}
	spares := st.sparesOf()
	if hb.Unchanged {
		return q.unchangedBeat(ctx, id, hb, spares)
	}
	if err := checkGPUs(hb.GPUs); err != nil {
		return api.HeartbeatAnswer{}, err
	}
	if err := checkLoad(hb.Load); err != nil {
		return api.HeartbeatAnswer{}, err
	}
	if len(hb.Workers) > maxWorkers {
		return api.HeartbeatAnswer{}, api.BadRequest("%d workers: at most %d", len(hb.Workers), maxWorkers)
	}
	// One bad entry is refused alone, named in the answer; the rest of
	// the heartbeat is taken.
	var refused []api.RefusedWorker
	hb.Workers, hb.WorkerTokens, refused = splitWorkers(hb.Workers, hb.WorkerTokens, st.uriMemo())
	if len(refused) > 0 {
		q.log.Warn("heartbeat entries refused", "pool_id", id, "refused", len(refused), "first_worker_id", refused[0].WorkerID,
			"first_reason", refused[0].Reason)
	}
	sanitizeWorkers(hb.Workers)
	if _, known := q.reg.StatusOf(id); known {
		q.tokens.replace(id, hb.WorkerTokens) // before the rows change, as for events
	}
	beat, err := q.heartbeat(ctx, id, hb, refused, spares)
	if err != nil {
		return api.HeartbeatAnswer{}, err
	}
	if beat.Changed {
		// Requests waiting for capacity may have it now. A full beat that
		// repeats the last one is an unchanged beat (which pokes nothing).
		q.routing.Poke()
	}
	q.takeLoad(id, hb.Load)
	return api.HeartbeatAnswer{PoolID: id, Status: string(beat.Status), Refused: refused, QueenEpoch: q.st.Epoch(),
		LoadEverySeconds: int(uiLoadStep / time.Second)}, nil
}

// unchangedBeat takes a heartbeat that says nothing changed since the
// pool's last full one: the lease is renewed and the rows of the workers
// that heartbeat listed are seen again. A queen that holds no full
// heartbeat of the pool asks for one.
func (q *Queen) unchangedBeat(ctx context.Context, id string, hb api.Heartbeat, spares *registry.Spares) (api.HeartbeatAnswer, error) {
	if len(hb.GPUs) > 0 || len(hb.Workers) > 0 || len(hb.WorkerTokens) > 0 {
		return api.HeartbeatAnswer{}, api.BadRequest("an unchanged heartbeat carries no gpus, workers or worker_tokens")
	}
	if err := checkLoad(hb.Load); err != nil {
		return api.HeartbeatAnswer{}, err
	}
	q.metrics.unchangedBeats.Inc()
	beat, err := q.reg.HeartbeatReusing(ctx, id, hb, spares)
	if err != nil {
		return api.HeartbeatAnswer{}, err
	}
	if !beat.FullWanted {
		q.reconcile(ctx, id, beat, beat.Workers, nil)
		q.takeLoad(id, hb.Load)
	}
	return api.HeartbeatAnswer{PoolID: id, Status: string(beat.Status), FullWanted: beat.FullWanted, QueenEpoch: q.st.Epoch(),
		LoadEverySeconds: int(uiLoadStep / time.Second)}, nil
}

// splitWorkers checks each worker entry (and its token) alone: the good
// ones are kept, each bad one is refused with its reason. A token for a
// worker the heartbeat does not list is dropped and named.
func splitWorkers(ws []api.Worker, tokens map[string]string, uris *uriMemo) ([]api.Worker, map[string]string, []api.RefusedWorker) {
	var refused []api.RefusedWorker
	var keptTokens map[string]string
	var listed map[string]bool
	if len(tokens) > 0 { // most heartbeats carry none
		keptTokens = make(map[string]string, len(tokens))
		listed = make(map[string]bool, len(ws))
		for _, w := range ws {
			listed[w.WorkerID] = true
		}
	}
	kept := ws[:0] // in place: entry n is read before the n-th kept one is written
	for _, w := range ws {
		err := checkWorkerURIs(w, uris)
		if err == nil && tokens[w.WorkerID] != "" {
			err = checkWorkerToken(tokens[w.WorkerID])
		}
		if err != nil {
			refused = append(refused, api.RefusedWorker{WorkerID: api.Printable(w.WorkerID, 128), Reason: api.Printable(err.Error(), 512)})
			continue
		}
		kept = append(kept, w)
		if tok := tokens[w.WorkerID]; tok != "" {
			keptTokens[w.WorkerID] = tok
		}
	}
	for id := range tokens {
		if !listed[id] {
			refused = append(refused, api.RefusedWorker{WorkerID: api.Printable(id, 128), Reason: "a token for a worker the heartbeat does not list"})
		}
	}
	return kept, keptTokens, refused
}

func (q *Queen) postEvent(w http.ResponseWriter, r *http.Request, c caller) error {
	var ev api.WorkerEvent
	if err := api.Decode(r, &ev, false); err != nil {
		return err
	}
	q.metrics.events.Inc()
	if err := checkID("pool_id", ev.PoolID); err != nil {
		return err
	}
	if err := q.reg.CheckHolder(ev.PoolID, hiveInstance(r)); err != nil {
		return err // a hive that was taken over: its workers are not the pool's
	}
	if err := checkID("worker_id", ev.WorkerID); err != nil {
		return err
	}
	if ev.LifecycleID != "" {
		if err := checkID("lifecycle_id", ev.LifecycleID); err != nil {
			return err
		}
	}
	switch ev.Kind {
	case "":
	case api.EventMemoryLeaked:
		return q.memoryLeaked(w, r, ev)
	default:
		return api.BadRequest("kind %q: want %q or none (a transition)", api.Printable(ev.Kind, 40), api.EventMemoryLeaked)
	}
	for name, s := range map[string]string{"from": ev.From, "to": ev.To} {
		if s == "" && name == "from" {
			continue
		}
		if _, err := lifecycle.ParseState(s); err != nil {
			return api.BadRequest("%s: %v", name, err)
		}
	}
	if ev.Worker.WorkerID != "" && ev.Worker.WorkerID != ev.WorkerID {
		return api.BadRequest("worker.worker_id %q differs from worker_id %q", ev.Worker.WorkerID, ev.WorkerID)
	}
	if len(ev.Reason) > 4*maxReasonLen {
		return api.BadRequest("reason is longer than %d bytes", 4*maxReasonLen)
	}
	ev.Reason = api.Printable(ev.Reason, 4*maxReasonLen)
	ws := []api.Worker{ev.Worker}
	sanitizeWorkers(ws)
	ev.Worker = ws[0]
	if ev.WorkerToken != "" {
		if err := checkWorkerToken(ev.WorkerToken); err != nil {
			return err
		}
	}
	// The worker as the queen keeps it (see event): its id and state are
	// the event's.
	if ev.Worker.WorkerID == "" {
		ev.Worker.WorkerID = ev.WorkerID
	}
	ev.Worker.Status = ev.To
	if err := checkWorker(ev.Worker); err != nil {
		return err
	}
	if _, known := q.reg.Get(ev.PoolID); known {
		// Before the row changes: a request routed to the worker as soon
		// as its row is RUNNING must find its token.
		q.tokens.event(ev, lifecycle.State(ev.To).Terminal())
	}
	ack, err := q.event(r.Context(), ev)
	if err != nil {
		return err
	}
	q.routing.Poke()
	api.WriteJSON(w, http.StatusOK, ack)
	return nil
}

// memoryLeaked audits a hive's report that a GPU's driver did not give an
// ended worker's memory back (worker.memory_leaked); the hive keeps the
// device out of placement itself, and says so in its heartbeats.
func (q *Queen) memoryLeaked(w http.ResponseWriter, r *http.Request, ev api.WorkerEvent) error {
	if ev.Reason == "" {
		return api.BadRequest("a %s event needs a reason", api.EventMemoryLeaked)
	}
	if len(ev.Reason) > 4*maxReasonLen {
		return api.BadRequest("reason is longer than %d bytes", 4*maxReasonLen)
	}
	if _, ok := q.reg.Get(ev.PoolID); !ok {
		return fmt.Errorf("%w: %s", registry.ErrNotFound, ev.PoolID)
	}
	reason := api.Printable(ev.Reason, 4*maxReasonLen)
	meta := map[string]any{"pool_id": ev.PoolID, "worker_id": ev.WorkerID, "gpu_device": ev.Worker.GPUDevice, "pid": ev.Worker.PID}
	// The worker's lifecycle row, as the other worker.* entries name it.
	target := ev.LifecycleID
	if target == "" {
		target = "worker:" + ev.WorkerID
	}
	controlPlane{q}.Audit(r.Context(), store.AuditEntry{TS: micro(time.Now()), Actor: "hive:" + ev.PoolID, Action: "worker.memory_leaked",
		Target: target, Reason: reason, Metadata: meta})
	q.log.Error("a hive reports GPU memory not given back", "pool_id", ev.PoolID, "worker_id", ev.WorkerID, "reason", reason)
	api.WriteJSON(w, http.StatusOK, api.EventAck{Applied: true})
	return nil
}

// poolFilter reads ?status=&model=&min_vram_bytes=; status may list
// several, comma-separated.
func (q *Queen) poolFilter(r *http.Request) (registry.Filter, error) {
	qs, err := query(r, "status", "model", "min_vram_bytes")
	if err != nil {
		return registry.Filter{}, err
	}
	var f registry.Filter
	if s := qs["status"]; s != "" {
		for _, name := range strings.Split(s, ",") {
			st, err := registry.ParseStatus(strings.TrimSpace(name))
			if err != nil {
				return f, api.BadRequest("%v", err)
			}
			f.Statuses = append(f.Statuses, st)
		}
	}
	if m := qs["model"]; m != "" {
		if err := checkModel(m); err != nil {
			return f, err
		}
		f.Model = q.models.resolve(m)
	}
	if v := qs["min_vram_bytes"]; v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return f, api.BadRequest("min_vram_bytes %q is not a byte count", v)
		}
		f.MinFreeBytes = n
	}
	return f, nil
}

func (q *Queen) getPools(w http.ResponseWriter, r *http.Request, _ caller) error {
	f, err := q.poolFilter(r)
	if err != nil {
		return err
	}
	pools := q.reg.Query(f)
	out := api.PoolList{Pools: make([]api.Pool, 0, len(pools))}
	for _, p := range pools {
		out.Pools = append(out.Pools, poolWire(p))
	}
	q.addPulls(r.Context(), out.Pools)
	q.addUsage(out.Pools)
	api.WriteJSON(w, http.StatusOK, out)
	return nil
}

// addUsage adds to each of pools when each live worker last served a
// request through this queen, and the pool's latest evictions.
func (q *Queen) addUsage(pools []api.Pool) {
	for i := range pools {
		p := &pools[i]
		p.Evictions = q.evictions(p.PoolID)
		// The registry lends its workers: change a copy.
		p.Workers = slices.Clone(p.Workers)
		for j := range p.Workers {
			w := &p.Workers[j]
			w.ModelName = q.models.nameOf(w.ModelRef)
			if last := q.routing.LastUsed(p.PoolID, w.WorkerID); !last.IsZero() && w.StoppedAt == nil {
				t := last.UTC()
				w.LastUsedAt = &t
			}
		}
	}
}

// evictions is pool's latest evictions with the names the model config
// gives their models.
func (q *Queen) evictions(pool string) []api.Eviction {
	evs := q.routing.Evictions(pool)
	for i := range evs {
		evs[i].ModelName, evs[i].ForName = q.models.nameOf(evs[i].Model), q.models.nameOf(evs[i].For)
	}
	return evs
}

func (q *Queen) getPool(w http.ResponseWriter, r *http.Request, _ caller) error {
	id := r.PathValue("id")
	if err := checkID("pool id", id); err != nil {
		return err
	}
	p, ok := q.reg.Get(id)
	if !ok {
		return fmt.Errorf("%w: %s", registry.ErrNotFound, id)
	}
	out := []api.Pool{poolWire(p)}
	q.addUsage(out)
	api.WriteJSON(w, http.StatusOK, out[0])
	return nil
}

// poolAction reads the {"reason", "now"} of a pool's drain, undrain or
// removal; def is the reason when the body gives none.
func poolAction(r *http.Request, def string) (reason string, now bool, err error) {
	var a api.PoolAction
	if err := api.Decode(r, &a, true); err != nil {
		return "", false, err
	}
	if strings.TrimSpace(a.Reason) == "" {
		return def, a.Now, nil
	}
	reason, err = checkReason(a.Reason)
	return reason, a.Now, err
}

// postDrain drains a pool: no new workers there; its running workers
// serve on, or with "now" are stopped gracefully. The reason is required
// (audit), and a drain of a drained pool is audited too.
func (q *Queen) postDrain(w http.ResponseWriter, r *http.Request, c caller) error {
	return q.poolChange(w, r, "", func(ctx context.Context, id, reason string) (registry.Pool, error) {
		if reason == "" {
			return registry.Pool{}, api.BadRequest("reason is required: say why the pool takes no new work, for the audit log")
		}
		before, known := q.reg.Get(id)
		p, err := q.reg.Drain(ctx, id, c.actor, reason)
		if err != nil {
			return p, err
		}
		if known && before.Drained {
			controlPlane{q}.Audit(ctx, store.AuditEntry{Actor: c.actor, Action: "pool.drain", Target: id, Reason: reason + " (already drained)"})
		}
		if ctx.Value(drainNowKey{}) == true {
			q.stopPoolWorkers(ctx, id, c.actor, "pool drained now: "+reason)
		}
		return p, nil
	})
}

// drainNowKey marks a drain request's context as one with "now".
type drainNowKey struct{}

// stopPoolWorkers stops every live worker of pool gracefully, as an
// operator's stop each (audited), for a drain with "now".
func (q *Queen) stopPoolWorkers(ctx context.Context, pool, actor, reason string) {
	for _, id := range q.rows.livePoolRows(pool) {
		if _, err := q.StopWorker(ctx, id, true, reason, actor); err != nil && !errors.Is(err, ErrRowEnded) {
			q.log.Warn("drain now: cannot stop a worker", "lifecycle_id", id, "pool_id", pool, "err", err)
		}
	}
}

// postUndrain takes a drained pool back; the reason is required (audit).
func (q *Queen) postUndrain(w http.ResponseWriter, r *http.Request, c caller) error {
	return q.poolChange(w, r, "", func(ctx context.Context, id, reason string) (registry.Pool, error) {
		if reason == "" {
			return registry.Pool{}, api.BadRequest("reason is required: say why the pool takes work again, for the audit log")
		}
		p, err := q.reg.Undrain(ctx, id, c.actor, reason)
		q.routing.Poke() // requests waiting for capacity may have it now
		return p, err
	})
}

// poolChange applies change to the request's pool with its reason (def
// when the body gives none) and answers the pool.
func (q *Queen) poolChange(w http.ResponseWriter, r *http.Request, def string,
	change func(ctx context.Context, id, reason string) (registry.Pool, error)) error {
	id := r.PathValue("id")
	if err := checkID("pool id", id); err != nil {
		return err
	}
	reason, now, err := poolAction(r, def)
	if err != nil {
		return err
	}
	ctx := r.Context()
	if now {
		if !strings.HasSuffix(r.URL.Path, "/drain") {
			return api.BadRequest("now applies to a drain only")
		}
		ctx = context.WithValue(ctx, drainNowKey{}, true)
	}
	p, err := change(ctx, id, reason)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, poolWire(p))
	return nil
}

// deletePool is an operator's removal: the reason is required (audit).
func (q *Queen) deletePool(w http.ResponseWriter, r *http.Request, c caller) error {
	return q.poolChange(w, r, "", func(ctx context.Context, id, reason string) (registry.Pool, error) {
		if reason == "" {
			return registry.Pool{}, api.BadRequest("reason is required: say why the pool is removed, for the audit log")
		}
		p, err := q.reg.Deregister(ctx, id, c.actor, reason)
		q.tokens.forget(id)
		return p, err
	})
}

// postOffline is a hive saying it stops (POST /v2/pools/{id}/offline,
// cluster token): after stopping its workers and sending their last
// events, it takes its pool offline at once rather than leaving it
// healthy until its heartbeats time out.
// A hive that was taken over is refused (409): the pool is another's.
func (q *Queen) postOffline(w http.ResponseWriter, r *http.Request, c caller) error {
	if err := q.reg.CheckHolder(r.PathValue("id"), hiveInstance(r)); err != nil {
		return err
	}
	return q.deregister(w, r, "hive:"+r.PathValue("id"), "the hive stopped")
}

// deregister takes the request's pool offline for actor.
func (q *Queen) deregister(w http.ResponseWriter, r *http.Request, actor, def string) error {
	return q.poolChange(w, r, def, func(ctx context.Context, id, reason string) (registry.Pool, error) {
		p, err := q.reg.Deregister(ctx, id, actor, reason)
		q.tokens.forget(id)
		return p, err
	})
}

func poolWire(p registry.Pool) api.Pool {
	out := api.Pool{PoolID: p.ID, Endpoint: p.Endpoint, NodeID: p.NodeID, Version: p.Version, Status: string(p.Status),
		Drained: p.Drained, RegisteredAt: p.RegisteredAt.UTC(), StatusChangedAt: p.StatusChangedAt.UTC(),
		GPUs: p.GPUs, Workers: p.Workers, MaxLoaded: p.MaxLoaded}
	if !p.LastHeartbeatAt.IsZero() {
		t := p.LastHeartbeatAt.UTC()
		out.LastHeartbeatAt = &t
	}
	if out.GPUs == nil {
		out.GPUs = []api.GPU{}
	}
	if out.Workers == nil {
		out.Workers = []api.Worker{}
	}
	return out
}

// checkLoad checks a heartbeat's node load (nil: none): at most maxGPUs
// devices, percentages within 0–100.
func checkLoad(l *api.NodeLoad) error {
	if l == nil {
		return nil
	}
	if len(l.GPUs) > maxGPUs {
		return api.BadRequest("load of %d gpus: at most %d", len(l.GPUs), maxGPUs)
	}
	if c := l.CPUPercent; c != nil && !(*c >= 0 && *c <= 100) {
		return api.BadRequest("load cpu_percent %v is not within 0 and 100", *c)
	}
	for _, g := range l.GPUs {
		if g.UtilPercent < 0 || g.UtilPercent > 100 {
			return api.BadRequest("gpu %d util_percent %d is not within 0 and 100", g.ID, g.UtilPercent)
		}
	}
	return nil
}

// takeLoad records a heartbeat's node load for the dashboard's graphs:
// one sample a uiLoadStep at most, with the pool's devices as the
// registry has them now.
func (q *Queen) takeLoad(id string, l *api.NodeLoad) {
	now := time.Now()
	if l == nil || !q.ui.loadDue(id, now) {
		return
	}
	if p, ok := q.reg.Get(id); ok {
		q.ui.nodeLoad(p, *l, now)
	}
}
