package llamacpp

import (
	"log/slog"
	"testing"
)

// The warning llama.cpp writes for each sequence of a step the engine
// ended on purpose goes out at Debug; other lines keep their level.
func TestLineLevelDemotesOnlyTheEndedStepsWarning(t *testing.T) {
	for _, tc := range []struct {
		level slog.Level
		line  string
		want  slog.Level
	}{
		{slog.LevelWarn, "decode: removing memory module entries for seq_id = 1, pos = [37, +inf)", slog.LevelDebug},
		{slog.LevelWarn, "llama_model_load: some other warning", slog.LevelWarn},
		{slog.LevelError, "decode: removing memory module entries for seq_id = 1, pos = [37, +inf)", slog.LevelError},
		{slog.LevelDebug, "print_info: n_ctx = 256", slog.LevelDebug},
	} {
		if got := lineLevel(tc.level, tc.line); got != tc.want {
			t.Errorf("lineLevel(%v, %q) = %v, want %v", tc.level, tc.line, got, tc.want)
		}
	}
}
