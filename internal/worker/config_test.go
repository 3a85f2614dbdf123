package worker

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestConfigDefaults(t *testing.T) {
	cfg := Config{ModelPath: "/models/tiny-q4.gguf", Addr: "127.0.0.1:8001", Slots: 2}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	want := Config{
		WorkerID: "standalone", ModelPath: "/models/tiny-q4.gguf", ModelRef: "tiny-q4", Addr: "127.0.0.1:8001",
		Slots: 2, QueueSize: 8, MaxBodyBytes: DefaultMaxBodyBytes, ShutdownGrace: 30 * time.Second,
		CallbackAttempts: 5, CallbackBackoff: 200 * time.Millisecond, CallbackTimeout: 5 * time.Second,
		RetryAfter: time.Second, ClaimInterval: 10 * time.Second,
	}
	want.Engine.ModelPath, want.Engine.Slots = want.ModelPath, 2
	if diff := cmp.Diff(want, cfg, cmpopts.IgnoreFields(Config{}, "Logger")); diff != "" {
		t.Errorf("config mismatch (-want +got):\n%s", diff)
	}
	if cfg.Logger == nil {
		t.Error("no default logger")
	}
}

func TestConfigValidateRejects(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no model", Config{Addr: "127.0.0.1:1"}, "model path"},
		{"no address", Config{ModelPath: "m.gguf"}, "listen address"},
		{"bad address", Config{ModelPath: "m.gguf", Addr: "localhost"}, "listen address"},
		{"public address without token", Config{ModelPath: "m.gguf", Addr: "0.0.0.0:8001"}, "loopback"},
		{"callback without worker id", Config{ModelPath: "m.gguf", Addr: "127.0.0.1:1", CallbackURL: "http://h/cb"}, "worker id"},
		{"callback not a URL", Config{ModelPath: "m.gguf", Addr: "127.0.0.1:1", WorkerID: "w", CallbackURL: "hive:9200"}, "callback URL"},
		{"queen and callback", Config{ModelPath: "m.gguf", Addr: "127.0.0.1:1", WorkerID: "w", CallbackURL: "http://h/cb", QueenURL: "http://q:8080"}, "not both"},
		{"queen not a URL", Config{ModelPath: "m.gguf", Addr: "127.0.0.1:1", QueenURL: "q:8080"}, "queen URL"},
		{"queen URL with a path", Config{ModelPath: "m.gguf", Addr: "127.0.0.1:1", QueenURL: "http://q:8080/x?y"}, "queen URL"},
		{"advertise not a URL", Config{ModelPath: "m.gguf", Addr: "127.0.0.1:1", Advertise: "host:1"}, "advertised URL"},
		{"negative slots", Config{ModelPath: "m.gguf", Addr: "127.0.0.1:1", Slots: -1}, "slots"},
		{"negative grace", Config{ModelPath: "m.gguf", Addr: "127.0.0.1:1", ShutdownGrace: -time.Second}, "negative"},
		{"negative claim interval", Config{ModelPath: "m.gguf", Addr: "127.0.0.1:1", ClaimInterval: -time.Second}, "negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate = %v, want ErrInvalidConfig mentioning %q", err, tt.want)
			}
		})
	}
}

func TestConfigPublicAddressWithToken(t *testing.T) {
	cfg := Config{ModelPath: "m.gguf", Addr: "0.0.0.0:8001", Token: "t"}
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate = %v, want nil with a token", err)
	}
}
