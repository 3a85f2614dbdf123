package queen

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/config"
	"github.com/apiary-llm/apiary/internal/modelconfig"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/routing"
	"github.com/apiary-llm/apiary/internal/store"
)

// modelConfig owns the queen's model config (Config.ModelsFile): loaded
// by New, which refuses a bad file, then reloaded on Reload (SIGHUP) and
// when the file changes (watch). A reload that fails keeps the file in
// force. Readers take the current file without a lock.
type modelConfig struct {
	path string
	cur  atomic.Pointer[modelconfig.File] // nil: no file

	mu   sync.Mutex // serializes reloads
	seen stamp      // guarded by mu; the content last tried, good or bad
}

// stamp is what the watcher compares: the file's size and time, then
// its content's hash.
type stamp struct {
	mod  time.Time
	size int64
	sum  [sha256.Size]byte
}

// readStamped reads the file with its stamp.
func readStamped(path string) ([]byte, stamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, stamp{}, err
	}
	if fi.Size() > modelconfig.MaxFileBytes {
		return nil, stamp{}, fmt.Errorf("%s is larger than %d bytes", path, modelconfig.MaxFileBytes)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, stamp{}, err
	}
	return data, stamp{mod: fi.ModTime(), size: fi.Size(), sum: sha256.Sum256(data)}, nil
}

// loadModelConfig reads and validates path at start: every problem
// named by its path in the file.
func loadModelConfig(path string) (*modelConfig, error) {
	mc := &modelConfig{path: path}
	if path == "" {
		return mc, nil
	}
	data, st, err := readStamped(path)
	if err != nil {
		return nil, fmt.Errorf("the model config: %w", err)
	}
	f, err := modelconfig.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("the model config %s is not valid:\n%w", path, config.Rename(err, nil))
	}
	mc.cur.Store(f)
	mc.seen = st
	return mc, nil
}

// file is the config in force (nil: none).
func (mc *modelConfig) file() *modelconfig.File { return mc.cur.Load() }

// replicas is the replica settings the file gives: the models with
// min_workers or max_workers, by their file.
func (mc *modelConfig) replicas() map[string]routing.Replica {
	f := mc.file()
	out := map[string]routing.Replica{}
	for _, name := range f.Names() {
		m := f.Models[name]
		if m.MinWorkers == nil && m.MaxWorkers == nil {
			continue
		}
		r := routing.Replica{}
		if m.MinWorkers != nil {
			r.Min = *m.MinWorkers
		}
		if m.MaxWorkers != nil {
			n := *m.MaxWorkers
			r.Max = &n
		}
		out[m.File] = r
	}
	return out
}

// engine is the hive engine a worker of ref runs on: its model's engine,
// "" for the built-in one.
func (mc *modelConfig) engine(ref string) string {
	_, m, ok := mc.file().ByFile(ref)
	if !ok || m.Engine == modelconfig.EngineBuiltin {
		return ""
	}
	return m.Engine
}

// workerOptions is how a worker of ref starts: its model's ctx_size,
// slots, threads and idle_timeout, when the file configures it.
func (mc *modelConfig) workerOptions(ref string) api.WorkerOptions {
	_, m, ok := mc.file().ByFile(ref)
	if !ok {
		return api.WorkerOptions{}
	}
	var o api.WorkerOptions
	for _, p := range []struct {
		from *int
		to   *int
	}{{m.CtxSize, &o.CtxSize}, {m.Slots, &o.Slots}, {m.Threads, &o.Threads}} {
		if p.from != nil {
			*p.to = *p.from
		}
	}
	o.IdleTimeoutMS = m.IdleTimeout.Milliseconds()
	o.Projector = m.MMProj
	return o
}

// errUnchanged is a reload that found the content in force.
var errUnchanged = errors.New("the model config is unchanged")

// reload reads the file again; force reads it even when its stamp is the
// one last tried (SIGHUP). It returns the new file and what changed,
// errUnchanged, or why the file was refused.
func (mc *modelConfig) reload(force bool) (next *modelconfig.File, changes []string, err error) {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	if !force {
		fi, err := os.Stat(mc.path)
		if err == nil && fi.ModTime().Equal(mc.seen.mod) && fi.Size() == mc.seen.size {
			return nil, nil, errUnchanged
		}
	}
	data, st, err := readStamped(mc.path)
	if err != nil {
		// A file that is gone (an editor replacing it) is reported once,
		// not at every look.
		if !force && mc.seen.size == -1 {
			return nil, nil, errUnchanged
		}
		mc.seen = stamp{size: -1}
		return nil, nil, err
	}
	same := st.sum == mc.seen.sum
	mc.seen = st
	if same && !force {
		return nil, nil, errUnchanged
	}
	next, err = modelconfig.Parse(data)
	if err != nil {
		return nil, nil, config.Rename(err, nil)
	}
	old := mc.cur.Load()
	changes = next.Diff(old)
	mc.cur.Store(next)
	if len(changes) == 0 {
		return next, nil, errUnchanged
	}
	return next, changes, nil
}

// Reload reads the model config file again (what SIGHUP does): a valid
// file takes effect at once and is audited as config.reloaded with what
// changed; a bad one is logged and audited as config.reload_failed with
// every problem, and the file in force stays. It waits until the queen
// serves; a queen without --config has nothing to reload.
func (q *Queen) Reload(ctx context.Context) error {
	if q.models.path == "" {
		return errors.New("no model config to reload (start the queen with --config FILE)")
	}
	select {
	case <-q.ready:
	case <-q.done:
		return errors.New("not running")
	case <-ctx.Done():
		return ctx.Err()
	}
	return q.reloadModels(ctx, true, "SIGHUP")
}

// reloadModels reloads the model config (force: even when the file
// looks unchanged) and applies it, with its log line and audit entry.
func (q *Queen) reloadModels(ctx context.Context, force bool, trigger string) error {
	next, changes, err := q.models.reload(force)
	switch {
	case errors.Is(err, errUnchanged):
		if force {
			q.log.Info("model config reloaded: nothing changed", "path", q.models.path, "trigger", trigger)
		}
		return nil
	case err != nil:
		// The audit entry first: the log line says it is on record.
		controlPlane{q}.Audit(ctx, store.AuditEntry{Actor: registry.ActorQueen, Action: "config.reload_failed", Target: "config:" + q.models.path,
			Reason: err.Error(), Metadata: map[string]any{"trigger": trigger}})
		q.log.Error("model config refused; the one in force stays", "path", q.models.path, "trigger", trigger, "err", err)
		return fmt.Errorf("the model config %s is not valid; the one in force stays:\n%w", q.models.path, err)
	}
	q.routing.SetModels(next)
	controlPlane{q}.Audit(ctx, store.AuditEntry{Actor: registry.ActorQueen, Action: "config.reloaded", Target: "config:" + q.models.path,
		Reason: fmt.Sprintf("%d models changed", len(changes)), Metadata: map[string]any{"trigger": trigger, "changes": changes, "models": next.Names()}})
	q.log.Info("model config reloaded", "path", q.models.path, "trigger", trigger, "changes", changes)
	return nil
}

// watchModels reloads the model config when its file changes: its size
// or time every interval, then its content's hash.
func (q *Queen) watchModels(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = q.reloadModels(ctx, false, "file changed")
		}
	}
}

// resolve is the model ref a configured name or alias stands for; any
// other name is a ref as it is.
func (mc *modelConfig) resolve(name string) string {
	if _, m, ok := mc.file().Resolve(name); ok {
		return m.File
	}
	return name
}

// nameOf is the name the config gives the model whose file is ref; ""
// when it names none (or names it by its file).
func (mc *modelConfig) nameOf(ref string) string {
	if name, _, ok := mc.file().ByFile(ref); ok && name != ref {
		return name
	}
	return ""
}

// shown is how a person sees model ref: by the name the config gives
// it, else by its file.
func (mc *modelConfig) shown(ref string) string {
	return cmp.Or(mc.nameOf(ref), ref)
}
