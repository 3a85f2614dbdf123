package queen

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/dashboard"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/store"
	"github.com/apiary-llm/apiary/internal/version"
)

// The dashboard (/ui/): the page's files, its snapshot and its stream of
// changes. The page is an admin client like any other: the data
// endpoints take the admin token, the files themselves hold no data.

// Dashboard bounds.
const (
	// uiRecentEnded is how many ended rows the dashboard shows besides
	// the live ones (the newest; older ones are in the admin API).
	uiRecentEnded = 100
	// uiStep and uiBuckets are the per-model rates' resolution and
	// length: 5 s buckets over the last 10 minutes.
	uiStep    = 5 * time.Second
	uiBuckets = 120
	// uiTimeGrain rounds the heartbeat times the page shows, so that a
	// beat that changes nothing else sends nothing.
	uiTimeGrain = 10 * time.Second
)

// ui is the queen's dashboard state: the hub the pages follow, the rates
// window, and the rows that ended lately (the live ones are the
// rowBook's).
type ui struct {
	hub    *dashboard.Hub
	window *dashboard.Window

	mu    sync.Mutex
	ended map[string]store.Row // guarded by mu; at most uiRecentEnded, the newest by stop time
	// rowJSON is the JSON of each row shown, kept until the row changes
	// (rowChanged) or its heartbeat time does: most rows do not change
	// between two pushes. Guarded by mu; bounded by the live rows and
	// ended.
	rowJSON map[string]cachedRow
	// gen counts the row changes (guarded by mu): a build keeps no JSON
	// of a row that changed after the build began.
	gen uint64
	// requests are the recent requests' items, the newest
	// uiRecentRequests; reqSeq numbers them. Guarded by mu.
	requests *dashboard.Ring[uiItem]
	reqSeq   uint64
	// nodes are the pools' load samples, each the last uiLoadSamples, at
	// most uiMaxNodes pools. Guarded by mu.
	nodes map[string]*nodeSeries
}

// cachedRow is a row's item as last marshalled (nil: none since its
// last change), the heartbeat time it showed, and the gen of the row's
// last change.
type cachedRow struct {
	beat    time.Time
	data    json.RawMessage
	changed uint64
}

func newUI(build func() dashboard.Snapshot) *ui {
	return &ui{hub: dashboard.NewHub(dashboard.HubConfig{Build: build}), window: dashboard.NewWindow(uiStep, uiBuckets),
		ended: map[string]store.Row{}, rowJSON: map[string]cachedRow{},
		requests: dashboard.NewRing[uiItem](uiRecentRequests), nodes: map[string]*nodeSeries{}}
}

// rowChanged is the rowBook's hook: an ended row joins the recent ones,
// and the pages learn of every change.
func (u *ui) rowChanged(r store.Row) {
	u.mu.Lock()
	u.gen++
	u.rowJSON[r.ID] = cachedRow{changed: u.gen}
	if r.Status.Terminal() {
		u.addEndedLocked(r)
	}
	u.mu.Unlock()
	u.hub.Changed()
}

func (u *ui) addEndedLocked(r store.Row) {
	u.ended[r.ID] = r
	if len(u.ended) <= uiRecentEnded {
		return
	}
	oldest := ""
	var at time.Time
	for id, e := range u.ended {
		t := endTime(e)
		if oldest == "" || t.Before(at) {
			oldest, at = id, t
		}
	}
	delete(u.ended, oldest)
	delete(u.rowJSON, oldest)
}

func endTime(r store.Row) time.Time {
	if r.StoppedAt != nil {
		return *r.StoppedAt
	}
	return r.CreatedAt
}

// loadEnded reads the newest ended rows once, at start.
func (u *ui) loadEnded(ctx context.Context, st *store.Store) error {
	var rows []store.Row
	err := st.View(ctx, func(tx *store.Tx) (err error) {
		rows, err = tx.Rows(store.RowFilter{Statuses: []lifecycle.Status{rowStopped, rowFailed}, Limit: uiRecentEnded})
		return err
	})
	if err != nil {
		return fmt.Errorf("load the dashboard's ended rows: %w", err)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, r := range rows {
		u.addEndedLocked(r)
	}
	return nil
}

// sample feeds the rates window every uiStep until ctx ends.
func (q *Queen) sampleUI(ctx context.Context) {
	t := time.NewTicker(uiStep)
	defer t.Stop()
	q.ui.window.Sample(time.Now(), q.uiTotals())
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			q.ui.window.Sample(now, q.uiTotals())
			q.ui.hub.Changed()
		}
	}
}

func (q *Queen) uiTotals() map[string]dashboard.Counts {
	out := map[string]dashboard.Counts{}
	for model, t := range q.routing.Totals() {
		out[q.models.shown(model)] = dashboard.Counts{Requests: t.Requests, Tokens: t.Tokens, TTFTCount: t.TTFTCount, TTFTSum: t.TTFTSum,
			ITLCount: t.ITLCount, ITLSum: t.ITLSum}
	}
	return out
}

// uiQueen is the "queen" item of the snapshot.
type uiQueen struct {
	Version string `json:"version"`
	URL     string `json:"url"`
	Tokens  bool   `json:"tokens"`
}

// uiPool is a "pool/ID" item.
type uiPool struct {
	ID              string     `json:"id"`
	Status          string     `json:"status"`
	Drained         bool       `json:"drained"`
	NodeID          string     `json:"node_id"`
	Endpoint        string     `json:"endpoint"`
	Version         string     `json:"version"`
	LastHeartbeatAt *time.Time `json:"last_heartbeat_at,omitempty"`
	StatusChangedAt time.Time  `json:"status_changed_at"`
	Devices         []uiDevice `json:"devices"`
	Workers         int        `json:"workers"`
	MaxLoaded       int        `json:"max_loaded,omitempty"`
	// Loaded are the models its live workers run, with their last use;
	// Evictions what the queen stopped there to make room, newest first.
	Loaded    []uiLoaded     `json:"loaded"`
	Evictions []api.Eviction `json:"evictions,omitempty"`
}

// uiLoaded is one live worker of a pool card: its row's id, its model
// (by the name the config gives it, and its file),
// its state and when it last served (to the page's time grain).
type uiLoaded struct {
	ID         string     `json:"id"`
	Model      string     `json:"model"` // its configured name, else its file
	Ref        string     `json:"ref"`
	Status     string     `json:"status"`
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
}

// uiBeats is the "beats" item: when each pool and each live row's
// worker was last in a heartbeat, to the microsecond, and At, the
// queen's time when it was built. The page shows a beat's age as At
// minus the beat plus the time since the item came, so that the
// browser's clock does not count and the age agrees with `pools ls`.
// It changes at every build; the page then updates only those texts.
// Bounded by the pools and the live rows.
type uiBeats struct {
	At      time.Time            `json:"at"`
	Pools   map[string]time.Time `json:"pools"`
	Workers map[string]time.Time `json:"workers"`
}

// uiDevice is a pool's device, with whether a new worker can go there.
type uiDevice struct {
	api.GPU
	Usable bool   `json:"usable"`
	Why    string `json:"why,omitempty"`
}

// uiModel is a "model/REF" item.
type uiModel struct {
	Name        string         `json:"name"`
	Ref         string         `json:"ref"`
	Aliases     []string       `json:"aliases,omitempty"`
	Configured  bool           `json:"configured"`
	RunningOn   []string       `json:"running_on,omitempty"`
	AvailableOn []string       `json:"available_on,omitempty"`
	Workers     map[string]int `json:"workers,omitempty"`
	Queued      int            `json:"queued"`
	OldestWait  *time.Time     `json:"oldest_wait,omitempty"`
	MinWorkers  *int           `json:"min_workers,omitempty"`
	MaxWorkers  *int           `json:"max_workers,omitempty"`
	CrashLoop   bool           `json:"crash_loop,omitempty"`
}

// uiSnapshot is the dashboard's state, from memory only: the registry's
// pools, the rowBook's live rows and the recent ended ones, the model
// config, routing's queues and catalog, and the rates window.
func (q *Queen) uiSnapshot() dashboard.Snapshot {
	s := dashboard.Snapshot{
		"queen": uiQueen{Version: version.Version, URL: q.URL(), Tokens: !q.cfg.Tokens.None()},
		"stats": q.ui.window.View(),
	}
	catalog := q.routing.Catalog()
	pools := q.reg.Query(registry.Filter{})
	beats := uiBeats{At: time.Now().UTC(), Pools: map[string]time.Time{}, Workers: map[string]time.Time{}}
	livePools := make(map[string]bool, len(pools))
	for _, p := range pools {
		livePools[p.ID] = true
	}
	q.ui.activityItems(s, livePools)
	for _, p := range pools {
		if !p.LastHeartbeatAt.IsZero() {
			beats.Pools[p.ID] = p.LastHeartbeatAt.UTC()
		}
		up := uiPoolOf(p, catalog[p.ID])
		up.Evictions = q.evictions(p.ID)
		for _, w := range p.Workers {
			if w.StoppedAt != nil || lifecycle.State(w.Status).Terminal() {
				continue
			}
			l := uiLoaded{ID: cmp.Or(w.LifecycleID, w.WorkerID), Model: q.models.shown(w.ModelRef), Ref: w.ModelRef, Status: w.Status}
			if last := q.routing.LastUsed(p.ID, w.WorkerID); !last.IsZero() {
				t := last.UTC().Truncate(uiTimeGrain)
				l.LastUsedAt = &t
			}
			up.Loaded = append(up.Loaded, l)
		}
		s["pool/"+p.ID] = up
	}

	q.ui.mu.Lock()
	began := q.ui.gen
	q.ui.mu.Unlock()
	q.rows.mu.Lock()
	live := make([]store.Row, 0, len(q.rows.active))
	for _, r := range q.rows.active {
		live = append(live, *r)
		if at, ok := q.rows.seenAt(r.ID); ok {
			beats.Workers[r.ID] = at
		} else if r.LastHeartbeatAt != nil {
			beats.Workers[r.ID] = r.LastHeartbeatAt.UTC()
		}
	}
	q.rows.mu.Unlock()
	s["beats"] = beats
	q.ui.mu.Lock()
	rows := append(live, slices.Collect(maps.Values(q.ui.ended))...)
	cache := maps.Clone(q.ui.rowJSON)
	q.ui.mu.Unlock()
	fresh := map[string]cachedRow{}

	models := map[string]*uiModel{}
	model := func(ref string) *uiModel {
		m, ok := models[ref]
		if !ok {
			m = &uiModel{Name: ref, Ref: ref}
			if name, cm, ok := q.models.file().ByFile(ref); ok {
				m.Name, m.Aliases, m.Configured = name, cm.Aliases, true
			}
			models[ref] = m
		}
		return m
	}
	for _, r := range rows {
		s["worker/"+r.ID] = q.uiRow(r, cache, fresh)
		if r.Status.Terminal() {
			continue
		}
		m := model(r.ModelRef)
		if m.Workers == nil {
			m.Workers = map[string]int{}
		}
		m.Workers[string(r.Status)]++
		if !slices.Contains(m.RunningOn, r.PoolID) {
			m.RunningOn = append(m.RunningOn, r.PoolID)
		}
	}
	if f := q.models.file(); f != nil {
		for _, name := range f.Names() {
			model(f.Models[name].File)
		}
	}
	for poolID, files := range catalog {
		for ref := range files {
			m := model(ref)
			m.AvailableOn = append(m.AvailableOn, poolID)
		}
	}
	for _, qu := range q.routing.Queues() {
		m := model(qu.Model)
		m.Queued += qu.Queued
		if m.OldestWait == nil || qu.Oldest.Before(*m.OldestWait) {
			t := qu.Oldest.Truncate(time.Second)
			m.OldestWait = &t
		}
	}
	for ref, rep := range (controlPlane{q}).Replicas() {
		m := model(ref)
		n := rep.Min
		m.MinWorkers, m.MaxWorkers = &n, rep.Max
	}
	for ref := range q.routing.CrashLoops() {
		model(ref).CrashLoop = true
	}
	for ref, m := range models {
		slices.Sort(m.RunningOn)
		slices.Sort(m.AvailableOn)
		s["model/"+ref] = m
	}
	q.ui.mu.Lock()
	for id, c := range fresh {
		cur, known := q.ui.rowJSON[id]
		if _, shown := s["worker/"+id]; shown && (!known || cur.changed <= began) {
			c.changed = cur.changed
			q.ui.rowJSON[id] = c
		}
	}
	q.ui.mu.Unlock()
	return s
}

// uiRow is a row's item: its JSON from cache while neither the row nor
// its (rounded) heartbeat time changed, else marshalled anew and put in
// fresh. A row with strikes is marshalled every time (they change
// without a row change).
func (q *Queen) uiRow(r store.Row, cache, fresh map[string]cachedRow) any {
	var beat time.Time
	if !r.Status.Terminal() {
		// When its worker was last in a heartbeat (the rowBook's memory;
		// the row in memory gets it only when it is written).
		q.rows.mu.RLock()
		at, ok := q.rows.seenAt(r.ID)
		if live := q.rows.active[r.ID]; !ok && live != nil && live.LastHeartbeatAt != nil {
			at, ok = *live.LastHeartbeatAt, true
		}
		q.rows.mu.RUnlock()
		if ok {
			beat = at.Truncate(uiTimeGrain)
		}
	} else if r.LastHeartbeatAt != nil {
		beat = r.LastHeartbeatAt.Truncate(uiTimeGrain)
	}
	if c, ok := cache[r.ID]; ok && c.data != nil && c.beat.Equal(beat) {
		return c.data
	}
	w := q.rowWire(r)
	w.LastHeartbeatAt = nil
	if !beat.IsZero() {
		w.LastHeartbeatAt = &beat
	}
	if w.Strikes != nil {
		return w
	}
	data, err := json.Marshal(w)
	if err != nil {
		return w
	}
	fresh[r.ID] = cachedRow{beat: beat, data: data}
	return json.RawMessage(data)
}

// uiPoolOf is a pool as the page shows it: each device with whether a
// new worker could go there, and why not (the pool's status; the hive's
// own verdict on the device; memory below the smallest model its hive
// has).
func uiPoolOf(p registry.Pool, files map[string]api.Model) uiPool {
	out := uiPool{ID: p.ID, Status: string(p.Status), Drained: p.Drained, NodeID: p.NodeID, Endpoint: p.Endpoint, Version: p.Version,
		StatusChangedAt: p.StatusChangedAt.UTC(), Devices: make([]uiDevice, 0, len(p.GPUs)), Workers: len(p.Workers), MaxLoaded: p.MaxLoaded,
		Loaded: []uiLoaded{}}
	// A person sees a worker by its row's id (wk-…), as in the table.
	rowID := map[string]string{}
	for _, w := range p.Workers {
		if w.LifecycleID != "" {
			rowID[w.WorkerID] = w.LifecycleID
		}
	}
	if !p.LastHeartbeatAt.IsZero() {
		t := p.LastHeartbeatAt.UTC().Truncate(uiTimeGrain)
		out.LastHeartbeatAt = &t
	}
	var smallest int64
	for _, m := range files {
		if m.SizeBytes > 0 && (smallest == 0 || m.SizeBytes < smallest) {
			smallest = m.SizeBytes
		}
	}
	for _, g := range p.GPUs {
		d := uiDevice{GPU: g, Usable: true}
		d.Workers = make([]string, 0, len(g.Workers))
		for _, id := range g.Workers {
			d.Workers = append(d.Workers, cmp.Or(rowID[id], id))
		}
		switch {
		case p.Status != registry.Healthy:
			d.Usable, d.Why = false, "the pool is "+string(p.Status)
		case g.Unusable != "":
			d.Usable, d.Why = false, g.Unusable
		case files != nil && len(files) == 0:
			d.Usable, d.Why = false, "its hive has no model"
		case g.FreeBytes == 0:
			d.Usable, d.Why = false, "no free memory"
		case smallest > 0 && g.FreeBytes < uint64(smallest):
			d.Usable, d.Why = false, fmt.Sprintf("%s free, less than the smallest model its hive has (%s)", api.FormatBytes(g.FreeBytes), api.FormatBytes(uint64(smallest)))
		}
		out.Devices = append(out.Devices, d)
	}
	return out
}

// getUI serves the page's files: /ui redirects to /ui/, /ui/ is the
// page, /ui/NAME one of its files; everything with the dashboard's
// security headers.
func (q *Queen) getUI(w http.ResponseWriter, r *http.Request, _ caller) error {
	if r.URL.Path == "/ui" {
		http.Redirect(w, r, "/ui/", http.StatusMovedPermanently)
		return nil
	}
	name := strings.TrimPrefix(r.URL.Path, "/ui/")
	data, ct, ok := dashboard.File(name)
	if !ok {
		return &api.RequestError{Status: http.StatusNotFound, Code: "not_found", Err: fmt.Errorf("the dashboard has no file %q", api.Printable(name, 100))}
	}
	dashboard.SetHeaders(w.Header())
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(data)
	}
	return nil
}

// getUISnapshot serves the dashboard's whole state at once.
func (q *Queen) getUISnapshot(w http.ResponseWriter, r *http.Request, _ caller) error {
	if _, err := query(r); err != nil {
		return err
	}
	dashboard.SetHeaders(w.Header())
	api.WriteJSON(w, http.StatusOK, q.ui.hub.Current())
	return nil
}

// getUIEvents streams the dashboard's state: a full message, then the
// changes (dashboard.Message), until the page goes or the queen stops.
func (q *Queen) getUIEvents(w http.ResponseWriter, r *http.Request, _ caller) error {
	if _, err := query(r); err != nil {
		return err
	}
	dashboard.SetHeaders(w.Header())
	q.ui.hub.ServeEvents(q.followers, w, r)
	return nil
}
