package worker

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// TestHoldEnv names the directory of Config.TestHoldDir for cmd/apiary:
// a test knob that holds generations (never for production). A hive
// passes it to its workers only when told (--pass-env).
const TestHoldEnv = "APIARY_TEST_HOLD_DIR"

// MaxTestHold bounds how long Config.TestHoldDir holds one generation in
// all: a test that forgets its file does not hold a worker for ever.
const MaxTestHold = 2 * time.Minute

// testHoldPoll is how often a held generation looks at the file again.
const testHoldPoll = 5 * time.Millisecond

// testHold returns what a generation calls before each piece of text
// after the first it sent (sent pieces so far): nil without
// Config.TestHoldDir, else a wait while a file named the model (every
// worker of it), or the model and this worker's lifecycle id
// ("tiny@wk-…": this worker alone), exists there, until ctx ends or
// MaxTestHold has passed in all. A file that holds a number N lets N
// pieces through before it holds (empty: one).
func (w *Worker) testHold() func(ctx context.Context, sent int) {
	if w.cfg.TestHoldDir == "" {
		return nil
	}
	files := []string{filepath.Join(w.cfg.TestHoldDir, w.cfg.ModelRef)}
	if w.cfg.LifecycleID != "" {
		files = append(files, filepath.Join(w.cfg.TestHoldDir, w.cfg.ModelRef+"@"+w.cfg.LifecycleID))
	}
	held := func(sent int) bool {
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && sent < n {
				continue
			}
			return true
		}
		return false
	}
	deadline := time.Now().Add(MaxTestHold)
	return func(ctx context.Context, sent int) {
		for time.Now().Before(deadline) && ctx.Err() == nil {
			if !held(sent) {
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(testHoldPoll):
			}
		}
	}
}
