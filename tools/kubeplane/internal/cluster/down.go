package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/apiary-llm/apiary/tools/kubeplane/internal/pidfile"
)

// stopGrace is how long a component gets between SIGTERM and SIGKILL; a
// node uses it to stop its Pods first.
const stopGrace = 15 * time.Second

// stopOrder is the order components stop in: nodes (and with them their
// Pods) first, etcd last.
var stopOrder = [][]string{{"node-"}, {"controller-manager", "scheduler"}, {"apiserver"}, {"etcd"}}

// Down stops everything a cluster in dir runs: each component gets SIGTERM
// to its process group and SIGKILL after stopGrace, and any Pod process
// group a node left behind gets the same with a short grace. It returns
// nil when nothing ran.
func Down(log *slog.Logger, dir string) error {
	d := layout(dir)
	recs, err := components(d)
	if err != nil {
		return err
	}
	var errs []error
	for _, stage := range stopOrder {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for name, rec := range recs {
			if !matches(name, stage) {
				continue
			}
			wg.Go(func() {
				if rec.Alive() {
					log.Info("stopping", "component", name, "pid", rec.PID)
				}
				err := rec.StopGroup(stopGrace)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", name, err))
					return
				}
				os.Remove(d.pidFile(name))
			})
		}
		wg.Wait()
	}
	// Pods a node could not stop (it was SIGKILLed): their leaders died
	// with the node, but descendants may remain in their groups.
	pgids, _ := filepath.Glob(filepath.Join(d.pods(), "*", "*", "pgid"))
	for _, path := range pgids {
		rec, err := pidfile.Read(path)
		if err != nil {
			continue
		}
		if rec.GroupAlive() {
			log.Info("stopping a Pod process group its node left", "pgid", rec.PID, "pid_file", path)
		}
		if err := rec.StopGroup(2 * time.Second); err != nil {
			errs = append(errs, err)
			continue
		}
		os.Remove(path)
	}
	return errors.Join(errs...)
}

func matches(name string, prefixes []string) bool {
	for _, p := range prefixes {
		if name == p || (strings.HasSuffix(p, "-") && strings.HasPrefix(name, p)) {
			return true
		}
	}
	return false
}

// components reads every pid file of d.
func components(d layout) (map[string]pidfile.Record, error) {
	paths, err := filepath.Glob(filepath.Join(d.runDir(), "*.pid"))
	if err != nil {
		return nil, err
	}
	out := map[string]pidfile.Record{}
	for _, p := range paths {
		rec, err := pidfile.Read(p)
		if err != nil {
			return nil, err
		}
		out[strings.TrimSuffix(filepath.Base(p), ".pid")] = rec
	}
	return out, nil
}

// running lists the components of d that still run.
func running(d layout) ([]string, error) {
	recs, err := components(d)
	if err != nil {
		return nil, err
	}
	var out []string
	for name, rec := range recs {
		if rec.Alive() {
			out = append(out, fmt.Sprintf("%s (pid %d)", name, rec.PID))
		}
	}
	return out, nil
}
