package queen

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/store"
)

// The row statuses, short.
const (
	rowStarting = lifecycle.StatusStarting
	rowRunning  = lifecycle.StatusRunning
	rowDraining = lifecycle.StatusDraining
	rowStopped  = lifecycle.StatusStopped
	rowFailed   = lifecycle.StatusFailed
)

// Row owners.
const (
	OwnerQueen    = "queen"    // placed by the queen on demand
	OwnerOperator = "operator" // started through the admin API
)

// newLifecycleID returns a fresh wk-… id.
func newLifecycleID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "wk-" + hex.EncodeToString(b[:])
}

// rowChange is one change to a row: its status (to; "" keeps it), why, who
// and what else to set. Every write of a row goes with an audit entry.
type rowChange struct {
	to     lifecycle.Status
	reason string
	actor  string
	action string
	meta   map[string]any
	set    func(*store.Row)
	// fromHive: a worker we are stopping may report serving states until
	// the stop reaches it; for a DRAINING row that is no news, not a
	// refused transition.
	fromHive bool
	// always audits the change even when the row already is as asked (an
	// operator's action is on record even when a hive event got there
	// first).
	always bool
	// rowReason, when set, is the row's reason instead of reason (which
	// the audit entry keeps): an operator's stop says who stopped it.
	rowReason string
	// check, when set, may refuse the change after the row is read and
	// before anything is written (a claim must find its row as it
	// expects); its error is returned as it is.
	check func(cur store.Row) error
}

// rowWhy is the reason the row gets.
func (c rowChange) rowWhy() string {
	if c.rowReason != "" {
		return c.rowReason
	}
	return c.reason
}

type workerKey struct{ pool, worker string }

// rowBook owns the lifecycle rows: the only writer of the workers table.
// Live (non-terminal) rows are indexed in memory; every change goes
// through apply, which checks the table and writes the row with its audit
// entry in one transaction before memory changes.
//
// Two locks: wmu serializes the writers (create, apply) and is held
// across their store transactions, so that row changes reach the store in
// the order they were decided; mu guards the memory and is never held
// across I/O, so that routing, which reads rows on every request, never
// waits for a slow or stalled store. Lock order: wmu, then mu.
//
// A heartbeat that finds its pool's rows as the last one did (nearly all
// of them) holds only mu's read lock, briefly, and allocates nothing
// there: once to read the rows (a shared copy, see poolRowsLocked) and
// once to store the time its workers were seen (seen). Ten thousand pools
// beat every second; behind an exclusive lock they would queue for each
// other, and behind one whose holder allocates, for the garbage
// collector.
type rowBook struct {
	st  *store.Store
	log *slog.Logger
	m   *metrics

	wmu      sync.Mutex
	mu       sync.RWMutex
	active   map[string]*store.Row          // guarded by mu; live rows by lifecycle id
	byPool   map[string]map[string]struct{} // guarded by mu; live row ids of each pool
	rowsOf   map[string][]store.Row         // guarded by mu; copies of a pool's live rows (see poolRowsLocked)
	byWorker map[workerKey]string           // guarded by mu; (pool, hive worker id) → lifecycle id
	byModel  map[string]map[string]struct{} // guarded by mu; live row ids of each model
	misses   map[string]int                 // guarded by mu; heartbeats in a row a live row was missing from
	seen     map[string]*atomic.Int64       // guarded by mu (the map; the values are set under the read lock): when a live row's worker was last in a heartbeat, Unix µs, 0 for not since it was loaded
	saved    map[string]time.Time           // guarded by mu; last_heartbeat_at as last written
	stopping map[workerKey]time.Time        // guarded by mu; rowless workers we asked to stop, and when

	// gen counts the changes of the live rows (each one under mu), for
	// the caches of what is derived from them (see candidateCache).
	gen atomic.Uint64

	// onChange, when set, is called with each row written, after memory
	// changed and outside mu (the dashboard). Set before the queen
	// serves; it must not block.
	onChange func(store.Row)
}

func newRowBook(st *store.Store, log *slog.Logger, m *metrics) *rowBook {
	return &rowBook{st: st, log: log, m: m,
		active: map[string]*store.Row{}, byPool: map[string]map[string]struct{}{}, rowsOf: map[string][]store.Row{},
		byWorker: map[workerKey]string{}, byModel: map[string]map[string]struct{}{}, misses: map[string]int{}, seen: map[string]*atomic.Int64{},
		saved: map[string]time.Time{}, stopping: map[workerKey]time.Time{}}
}

// load indexes the live rows of the store.
func (b *rowBook) load(ctx context.Context) error {
	var rows []store.Row
	err := b.st.View(ctx, func(tx *store.Tx) (err error) {
		rows, err = tx.Rows(store.RowFilter{Statuses: []lifecycle.Status{rowStarting, rowRunning, rowDraining}})
		return err
	})
	if err != nil {
		return fmt.Errorf("load lifecycle rows: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range rows {
		b.indexRowLocked(r)
	}
	for pool := range b.byPool {
		b.copyRowsLocked(pool)
	}
	b.log.Info("loaded live lifecycle rows", "rows", len(rows))
	return nil
}

// indexLocked puts r in memory (a terminal row leaves it).
func (b *rowBook) indexLocked(r store.Row) {
	if old, ok := b.active[r.ID]; ok && old.PoolID != r.PoolID {
		defer b.copyRowsLocked(old.PoolID)
	}
	b.indexRowLocked(r)
	b.copyRowsLocked(r.PoolID)
}

// copyRowsLocked makes rowsOf[pool] anew, or drops it for the next
// poolRowsLocked to make when the pool has more than eagerRows rows (a
// burst of changes to such a pool would copy them all at each).
func (b *rowBook) copyRowsLocked(pool string) {
	ids := b.byPool[pool]
	if len(ids) == 0 || len(ids) > eagerRows {
		delete(b.rowsOf, pool)
		return
	}
	rows := make([]store.Row, 0, len(ids))
	for id := range ids {
		rows = append(rows, *b.active[id])
	}
	b.rowsOf[pool] = rows
}

// indexRowLocked is indexLocked but for rowsOf.
func (b *rowBook) indexRowLocked(r store.Row) {
	b.gen.Add(1)
	if old, ok := b.active[r.ID]; ok {
		if old.WorkerID != "" {
			delete(b.byWorker, workerKey{old.PoolID, old.WorkerID})
		}
		// A row claimed by a worker run by hand moves to its pool.
		if old.PoolID != r.PoolID {
			unindex(b.byPool, old.PoolID, r.ID)
		}
		if old.ModelRef != r.ModelRef {
			unindex(b.byModel, old.ModelRef, r.ID)
		}
	}
	if r.Status.Terminal() {
		delete(b.active, r.ID)
		delete(b.misses, r.ID)
		delete(b.seen, r.ID)
		delete(b.saved, r.ID)
		unindex(b.byPool, r.PoolID, r.ID)
		unindex(b.byModel, r.ModelRef, r.ID)
		return
	}
	b.active[r.ID] = &r
	if b.seen[r.ID] == nil {
		b.seen[r.ID] = new(atomic.Int64)
	}
	index(b.byPool, r.PoolID, r.ID)
	index(b.byModel, r.ModelRef, r.ID)
	if r.WorkerID != "" {
		b.byWorker[workerKey{r.PoolID, r.WorkerID}] = r.ID
	}
}

// index puts id in idx[key].
func index(idx map[string]map[string]struct{}, key, id string) {
	if idx[key] == nil {
		idx[key] = map[string]struct{}{}
	}
	idx[key][id] = struct{}{}
}

// unindex takes id out of idx[key], and the key with its last id.
func unindex(idx map[string]map[string]struct{}, key, id string) {
	if ids := idx[key]; ids != nil {
		delete(ids, id)
		if len(ids) == 0 {
			delete(idx, key)
		}
	}
}

// create writes a new STARTING row with its audit entry.
func (b *rowBook) create(ctx context.Context, r store.Row, actor string, meta map[string]any) error {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	err := b.st.Update(ctx, func(tx *store.Tx) error {
		if err := tx.InsertRow(r); err != nil {
			return err
		}
		_, err := tx.Append(store.AuditEntry{TS: r.CreatedAt, Actor: actor, Action: "worker.start", Target: r.ID, Reason: r.Reason, Metadata: meta})
		return err
	})
	if err != nil {
		return fmt.Errorf("create lifecycle row: %w", err)
	}
	b.mu.Lock()
	b.indexLocked(r)
	b.mu.Unlock()
	b.changed(r)
	b.m.rowTransitions.WithLabelValues(string(r.Status)).Inc()
	b.log.Info("lifecycle row created", "lifecycle_id", r.ID, "pool_id", r.PoolID, "model_ref", r.ModelRef, "status", r.Status, "actor", actor)
	return nil
}

// get reads a row: live ones from memory, the others from the store.
func (b *rowBook) get(ctx context.Context, id string) (store.Row, error) {
	b.mu.RLock()
	if _, ok := b.active[id]; ok {
		row := b.rowLocked(id)
		b.mu.RUnlock()
		return row, nil
	}
	b.mu.RUnlock()
	var row store.Row
	err := b.st.View(ctx, func(tx *store.Tx) (err error) { row, err = tx.Row(id); return err })
	if errors.Is(err, store.ErrNotFound) {
		return row, fmt.Errorf("%w: %s", ErrRowNotFound, id)
	}
	return row, err
}

// lookup finds the live row of a hive's worker: by lifecycle id, or by
// (pool, worker id).
func (b *rowBook) lookup(pool, lifecycleID, workerID string) (string, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if r, ok := b.active[lifecycleID]; ok && lifecycleID != "" && r.PoolID == pool {
		return lifecycleID, true
	}
	id, ok := b.byWorker[workerKey{pool, workerID}]
	return id, ok && workerID != ""
}

// apply is the one transition function of a row. It checks the table
// (refusals are logged, counted and returned as ErrRefused), leaves ended
// rows alone (ErrRowEnded), writes the row with its audit entry, and only
// then changes memory. A change that changes nothing writes nothing.
func (b *rowBook) apply(ctx context.Context, id string, c rowChange) (store.Row, bool, error) {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	var cur store.Row
	b.mu.Lock()
	_, live := b.active[id]
	if live {
		cur = b.rowLocked(id)
		copyPtrs(&cur)
	}
	b.mu.Unlock()
	if !live {
		err := b.st.View(ctx, func(tx *store.Tx) (err error) { cur, err = tx.Row(id); return err })
		if errors.Is(err, store.ErrNotFound) {
			return cur, false, fmt.Errorf("%w: %s", ErrRowNotFound, id)
		}
		if err != nil {
			return cur, false, err
		}
	}
	if c.check != nil {
		if err := c.check(cur); err != nil {
			return cur, false, err
		}
	}
	to := c.to
	if to == "" || (c.fromHive && cur.Status == rowDraining && to == rowRunning) {
		to = cur.Status
	}
	if cur.Status.Terminal() {
		if c.always {
			// The operator's action is on record even though the row
			// ended before it landed. A stop whose worker's end reached
			// the queen first (a small model stops at once) is why it
			// stopped: the row says so, then how.
			next, amend := stoppedBy(cur, c)
			err := b.st.Update(ctx, func(tx *store.Tx) error {
				if amend {
					if err := tx.UpdateRow(next); err != nil {
						return err
					}
				}
				_, err := tx.Append(store.AuditEntry{Actor: c.actor, Action: c.action, Target: id, Reason: c.reason,
					Metadata: map[string]any{"pool_id": cur.PoolID, "status": string(cur.Status), "note": "the row had already ended"}})
				return err
			})
			if err != nil {
				return cur, false, fmt.Errorf("audit %s: %w", id, err)
			}
			if amend {
				b.changed(next)
			}
			return next, false, fmt.Errorf("%w: %s is %s", ErrRowEnded, id, cur.Status)
		}
		if to != cur.Status {
			b.refused(cur, to, c)
			return cur, false, fmt.Errorf("%w: %s is %s; %s → %s is not in the table", ErrRefused, id, cur.Status, cur.Status, to)
		}
		return cur, false, fmt.Errorf("%w: %s is %s", ErrRowEnded, id, cur.Status)
	}
	next := cur
	copyPtrs(&next)
	if c.set != nil {
		c.set(&next)
	}
	if to == cur.Status && to == rowDraining && !c.fromHive && c.reason != "" {
		next.Reason = c.rowWhy() // why it stops, over the hive's "drain requested"
	}
	if to != cur.Status {
		if !cur.Status.CanTransition(to) {
			b.refused(cur, to, c)
			return cur, false, fmt.Errorf("%w: %s %s → %s is not in the table", ErrRefused, id, cur.Status, to)
		}
		next.Status, next.Reason = to, c.rowWhy()
		if cur.Status == rowDraining && to == rowStopped && cur.Reason != "" && cur.Reason != c.reason {
			// Why it stopped (evicted, unloaded, idle, drained by whom),
			// then how: the row says both.
			next.Reason = cur.Reason + " (" + c.reason + ")"
		}
		if to.Terminal() && next.StoppedAt == nil {
			now := micro(time.Now())
			next.StoppedAt = &now
		}
		if to == rowRunning && next.ReadyAt == nil {
			now := micro(time.Now())
			next.ReadyAt = &now
		}
	}
	same := reflect.DeepEqual(cur, next)
	if same && !c.always {
		return cur, false, nil
	}
	meta := map[string]any{"pool_id": next.PoolID}
	if next.WorkerID != "" {
		meta["worker_id"] = next.WorkerID
	}
	if to != cur.Status {
		meta["from"], meta["to"] = string(cur.Status), string(to)
	}
	maps.Copy(meta, c.meta)
	err := b.st.Update(ctx, func(tx *store.Tx) error {
		if !same {
			if err := tx.UpdateRow(next); err != nil {
				return err
			}
		}
		_, err := tx.Append(store.AuditEntry{Actor: c.actor, Action: c.action, Target: id, Reason: c.reason, Metadata: meta})
		return err
	})
	if err != nil {
		return cur, false, fmt.Errorf("write lifecycle row %s: %w", id, err)
	}
	b.mu.Lock()
	if at, ok := b.seenAt(id); ok && (next.LastHeartbeatAt == nil || at.After(*next.LastHeartbeatAt)) {
		next.LastHeartbeatAt = &at // a heartbeat came while the row was written
	}
	b.indexLocked(next)
	b.mu.Unlock()
	b.changed(next)
	if to != cur.Status {
		b.m.rowTransitions.WithLabelValues(string(to)).Inc()
		b.log.Info("lifecycle row changed", "lifecycle_id", id, "pool_id", next.PoolID, "worker_id", next.WorkerID,
			"from", cur.Status, "to", to, "reason", c.reason, "actor", c.actor)
	}
	return next, !same, nil
}

// stoppedBy is cur, a row that ended while c, a stop (c.always), was
// on its way, with why it stopped in front of how when c's reason is
// not there yet: "evicted for b (graceful stop: exit code 0)", as a row
// that was DRAINING when it stopped says it. Only a STOPPED row: a
// FAILED one keeps its failure.
func stoppedBy(cur store.Row, c rowChange) (store.Row, bool) {
	why := c.rowWhy()
	if cur.Status != rowStopped || why == "" || strings.HasPrefix(cur.Reason, why) {
		return cur, false
	}
	next := cur
	next.Reason = why
	if cur.Reason != "" {
		next.Reason += " (" + cur.Reason + ")"
	}
	return next, true
}

func (b *rowBook) changed(r store.Row) {
	if b.onChange != nil {
		b.onChange(r)
	}
}

func (b *rowBook) refused(cur store.Row, to lifecycle.Status, c rowChange) {
	b.m.rowRefused.Inc()
	b.log.Warn("refused lifecycle transition", "lifecycle_id", cur.ID, "pool_id", cur.PoolID, "from", cur.Status, "to", to,
		"reason", c.reason, "actor", c.actor, "action", c.action)
}

// copyPtrs gives r its own copies of its pointer fields, so that a change
// to next never reaches the row in memory.
func copyPtrs(r *store.Row) {
	cp := func(p *time.Time) *time.Time {
		if p == nil {
			return nil
		}
		v := *p
		return &v
	}
	ci := func(p *int) *int {
		if p == nil {
			return nil
		}
		v := *p
		return &v
	}
	r.StartedAt, r.ReadyAt, r.StoppedAt, r.LastHeartbeatAt = cp(r.StartedAt), cp(r.ReadyAt), cp(r.StoppedAt), cp(r.LastHeartbeatAt)
	r.GPUDevice, r.PID, r.ExitCode = ci(r.GPUDevice), ci(r.PID), ci(r.ExitCode)
}

// micro is t as the store keeps it, so that memory and store agree.
func micro(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

// fillFromWorker copies what the hive knows of a worker into its row and
// reports whether that changed it. It replaces r's pointer fields, never
// writes through them, so a shallow copy of a row can be filled and
// compared without touching the row it was copied from.
func fillFromWorker(r *store.Row, w api.Worker) bool {
	changed := false
	if w.WorkerID != "" && r.WorkerID != w.WorkerID {
		r.WorkerID, changed = w.WorkerID, true
	}
	if w.WorkerID != "" && (r.GPUDevice == nil || *r.GPUDevice != w.GPUDevice) {
		g := w.GPUDevice
		r.GPUDevice, changed = &g, true
	}
	if w.VRAMBytes != 0 && r.VRAMBytes != w.VRAMBytes {
		r.VRAMBytes, changed = w.VRAMBytes, true
	}
	if w.URI != "" && r.URI != w.URI {
		r.URI, changed = w.URI, true
	}
	if w.PID != 0 && (r.PID == nil || *r.PID != w.PID) {
		p := w.PID
		r.PID, changed = &p, true
	}
	if r.StartedAt == nil && !w.StartedAt.IsZero() {
		t := micro(w.StartedAt)
		r.StartedAt, changed = &t, true
	}
	if r.ReadyAt == nil && w.ReadyAt != nil {
		t := micro(*w.ReadyAt)
		r.ReadyAt, changed = &t, true
	}
	if r.StoppedAt == nil && w.StoppedAt != nil {
		t := micro(*w.StoppedAt)
		r.StoppedAt, changed = &t, true
	}
	if w.ExitCode != nil && (r.ExitCode == nil || *r.ExitCode != *w.ExitCode) {
		e := *w.ExitCode
		r.ExitCode, changed = &e, true
	}
	return changed
}

// eagerRows is how many live rows a pool may have for its copies to be
// made at each change of one of them.
const eagerRows = 64

// poolRowsLocked returns copies of the live rows of pool, shared: the
// caller must not change them. They are made when one of the pool's rows
// changes (rare), not at every heartbeat that reads them; for a pool of
// more than eagerRows rows, by the first call after a change, which needs
// mu (ok is false under the read lock when they are not made yet). Their
// LastHeartbeatAt is the one they had when they changed (rowLocked has
// the latest).
func (b *rowBook) poolRowsLocked(pool string, write bool) (rows []store.Row, ok bool) {
	if rows, ok := b.rowsOf[pool]; ok || len(b.byPool[pool]) == 0 {
		return rows, true
	}
	if !write {
		return nil, false
	}
	ids := b.byPool[pool]
	rows = make([]store.Row, 0, len(ids))
	for id := range ids {
		rows = append(rows, *b.active[id])
	}
	b.rowsOf[pool] = rows
	return rows, true
}

// rowLocked is the live row id (which must exist) with its latest
// heartbeat time.
func (b *rowBook) rowLocked(id string) store.Row {
	r := *b.active[id]
	if at, ok := b.seenAt(id); ok {
		r.LastHeartbeatAt = &at
	}
	return r
}

// seenAt is when the live row id's worker was last in a heartbeat, if it
// was since the row was loaded. The caller holds mu (or its read lock).
func (b *rowBook) seenAt(id string) (time.Time, bool) {
	if s := b.seen[id]; s != nil {
		if us := s.Load(); us != 0 {
			return time.UnixMicro(us).UTC(), true
		}
	}
	return time.Time{}, false
}

// livePoolRows returns the ids of the live rows of pool.
func (b *rowBook) livePoolRows(pool string) []string {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return slices.Collect(maps.Keys(b.byPool[pool]))
}

// seeLocked records that a live row's worker was in a heartbeat at (its
// Unix µs); the time reaches the store when the stored one is
// registry.BeatTimeSave old (or at the final flush). The caller holds mu
// or its read lock: it allocates nothing and changes no map.
func (b *rowBook) seeLocked(id string, at int64) {
	if s := b.seen[id]; s != nil {
		s.Store(at)
	}
}

// touchLocked is seeLocked, and the row is no longer missing. The caller
// holds mu.
func (b *rowBook) touchLocked(id string, at int64) {
	b.seeLocked(id, at)
	delete(b.misses, id)
}

// flush writes the last_heartbeat_at times the store lacks: those of the
// rows whose stored one is BeatTimeSave old; all: every one newer than
// the stored one. A write that fails is tried again at the next flush.
func (b *rowBook) flush(ctx context.Context, all bool) error {
	b.mu.RLock()
	beats := map[string]time.Time{}
	for id := range b.seen {
		at, ok := b.seenAt(id)
		if late := at.Sub(b.saved[id]); ok && (late >= registry.BeatTimeSave || all && late > 0) {
			beats[id] = at
		}
	}
	b.mu.RUnlock()
	if len(beats) == 0 {
		return nil
	}
	err := b.st.Update(ctx, func(tx *store.Tx) error { return tx.TouchRows(beats) })
	if err != nil {
		return fmt.Errorf("write worker heartbeats: %w", err)
	}
	b.mu.Lock()
	for id, at := range beats {
		if _, ok := b.active[id]; ok && at.After(b.saved[id]) {
			b.saved[id] = at
		}
	}
	b.mu.Unlock()
	return nil
}

// markStopping records that the rowless worker k is being stopped; false
// when it already was within the last window.
func (b *rowBook) markStopping(k workerKey, now time.Time, window time.Duration) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for key, at := range b.stopping {
		if now.Sub(at) > window {
			delete(b.stopping, key)
		}
	}
	if _, ok := b.stopping[k]; ok {
		return false
	}
	b.stopping[k] = now
	return true
}

func (b *rowBook) unmarkStopping(k workerKey) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.stopping, k)
}

// liveCount is the number of live (STARTING, RUNNING, DRAINING) rows.
func (b *rowBook) liveCount() int {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return len(b.active)
}
