package llamacpp

/*
#include "ggml.h"
#include "llama.h"

extern void apiaryLlamaLog(int level, char *text);

static void forward_log(enum ggml_log_level level, const char *text, void *user_data) {
	(void)user_data;
	apiaryLlamaLog((int)level, (char *)text);
}

static void route_logs(void) { llama_log_set(forward_log, NULL); }
*/
import "C"

import (
	"context"
	"log/slog"
	"strings"
	"sync"
)

// llama.cpp logs through one process-wide callback. routeLogs points it at
// a slog.Logger: warnings and errors at their level, llama.cpp's chatty
// information lines at debug, whole lines only (llama.cpp writes some in
// pieces).
var llamaLog struct {
	mu      sync.Mutex
	logger  *slog.Logger    // guarded by mu
	partial strings.Builder // guarded by mu
	level   slog.Level      // guarded by mu; level of the partial line
}

func routeLogs(l *slog.Logger) {
	llamaLog.mu.Lock()
	llamaLog.logger = l
	llamaLog.mu.Unlock()
	C.route_logs()
}

//export apiaryLlamaLog
func apiaryLlamaLog(level C.int, text *C.char) {
	s := C.GoString(text)
	llamaLog.mu.Lock()
	defer llamaLog.mu.Unlock()
	if level != C.GGML_LOG_LEVEL_CONT {
		llamaLog.level = slogLevel(level)
	}
	llamaLog.partial.WriteString(s)
	if !strings.HasSuffix(s, "\n") || llamaLog.logger == nil {
		return
	}
	line := strings.TrimRight(llamaLog.partial.String(), "\n")
	llamaLog.partial.Reset()
	if line != "" {
		llamaLog.logger.Log(context.Background(), lineLevel(llamaLog.level, line), line, "source", "llama.cpp")
	}
}

// lineLevel is the level a whole line of llama.cpp's log goes out at:
// its own, except for warnings the engine causes on purpose. An ended
// background step (see run) makes llama.cpp warn, once a sequence, that
// it took the step's tokens out of the memory: that is the engine's
// plan, not news for an operator, and comes with every interactive
// request that arrives during a batch.
func lineLevel(level slog.Level, line string) slog.Level {
	if level == slog.LevelWarn && strings.Contains(line, "removing memory module entries for seq_id") {
		return slog.LevelDebug
	}
	return level
}

func slogLevel(level C.int) slog.Level {
	switch level {
	case C.GGML_LOG_LEVEL_ERROR:
		return slog.LevelError
	case C.GGML_LOG_LEVEL_WARN:
		return slog.LevelWarn
	default:
		return slog.LevelDebug
	}
}
