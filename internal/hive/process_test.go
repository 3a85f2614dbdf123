package hive

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// With APIARY_TEST_HIVE set, the test binary runs a hive in its own process
// (so that a test can SIGKILL it), with fake workers. Its configuration
// comes from the environment: APIARY_TEST_HIVE_DIR (data dir, with models/),
// APIARY_TEST_HIVE_FAKE (the workers' behaviour), APIARY_TEST_HIVE_QUEEN.
const hiveProcessEnv = "APIARY_TEST_HIVE"

func hiveProcessMain() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	dir := os.Getenv("APIARY_TEST_HIVE_DIR")
	h, err := New(Config{
		Addr:              "127.0.0.1:0",
		DataDir:           dir,
		QueenURL:          os.Getenv("APIARY_TEST_HIVE_QUEEN"),
		ClusterToken:      os.Getenv("APIARY_CLUSTER_TOKEN"),
		PoolID:            "pool-test",
		HeartbeatInterval: 100 * time.Millisecond,
		WorkerPath:        os.Args[0],
		WorkerEnv:         []string{fakeWorkerEnv + "=" + os.Getenv("APIARY_TEST_HIVE_FAKE")},
		PortMin:           testPortBase + 1000,
		PortMax:           testPortBase + 1999,
		CallbackTimeout:   10 * time.Second,
		HealthInterval:    time.Second,
		StopGrace:         2 * time.Second,
		ShutdownAck:       time.Second,
		IdleTimeout:       -1,
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 2
	}
	if err := h.Run(ctx); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	return 0
}
