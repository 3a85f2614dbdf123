package worker

import (
	"context"
	"os"
	"path/filepath"
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
// after the first it sent: nil without Config.TestHoldDir, else a wait while the file named
// the model exists there, until ctx ends or MaxTestHold has passed in all.
func (w *Worker) testHold() func(ctx context.Context) {
	if w.cfg.TestHoldDir == "" {
		return nil
	}
	file := filepath.Join(w.cfg.TestHoldDir, w.cfg.ModelRef)
	deadline := time.Now().Add(MaxTestHold)
	return func(ctx context.Context) {
		for time.Now().Before(deadline) && ctx.Err() == nil {
			if _, err := os.Stat(file); err != nil {
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(testHoldPoll):
			}
		}
	}
}
