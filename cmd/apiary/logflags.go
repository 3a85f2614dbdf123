package main

import (
	"io"
	"log/slog"
	"os"

	"github.com/spf13/pflag"
)

// logFlags are the daemons' --log-json and --log-level, and the one
// logger they make.
type logFlags struct {
	json  bool
	level string
}

func (f *logFlags) add(fl *pflag.FlagSet) {
	fl.BoolVar(&f.json, "log-json", os.Getenv(logJSONEnv) == "1", "write logs as JSON lines instead of text (default true when $"+logJSONEnv+" is 1)")
	level := "info"
	if v := os.Getenv(logLevelEnv); v != "" {
		level = v // a hive's workers inherit it
	}
	fl.StringVar(&f.level, "log-level", level, "least important log level: debug, info, warn or error (default from $"+logLevelEnv+")")
}

// logLevelEnv sets --log-level's default; a hive's workers inherit it
// through their environment, so their Debug logs can be asked for.
const logLevelEnv = "APIARY_LOG_LEVEL"

// logJSONEnv=1 sets --log-json's default, as logLevelEnv does the level's.
const logJSONEnv = "APIARY_LOG_JSON"

// logger writes to w at the level asked, as text or JSON; a level that is
// not one is a usage error.
func (f *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.level)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", f.level)
	}
	opts := &slog.HandlerOptions{Level: level}
	if f.json {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}
