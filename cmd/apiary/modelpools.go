package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/modelstore"
	"github.com/apiary-llm/apiary/internal/secret"
	"github.com/apiary-llm/apiary/internal/transport"
)

// pullPollInterval is how often `models pull --pool` reads the pull's
// progress from the queen.
const pullPollInterval = 500 * time.Millisecond

// poolFlags are the flags of the models commands that go through the
// queen: --queen, and $APIARY_ADMIN_TOKEN.
type poolFlags struct {
	queen string
}

func (f *poolFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.queen, "queen", defaultQueenURL(), queenFlagUsage+", with --pool or --all")
}

func (f *poolFlags) client() (*keeper.Client, error) {
	if _, err := transport.BaseURLs("--queen", f.queen); err != nil {
		return nil, usagef("%v", err)
	}
	return keeper.NewClient(f.queen, os.Getenv(secret.AdminTokenEnv), os.Getenv(secret.ClusterTokenEnv)), nil
}

// pullOnPool asks the queen to have pool's hive pull req, then follows
// its progress until it ends (unless detach).
func pullOnPool(ctx context.Context, c *keeper.Client, pool string, req api.PullModelRequest, detach bool, stdout, stderr io.Writer) error {
	st, err := c.PullModel(ctx, pool, req)
	if err != nil {
		return err
	}
	if detach {
		return printLine(stdout, "pull %s of %s started on pool %s (apiary models pull --pool %s --status shows it)", st.ID, st.Model, pool, pool)
	}
	p := newProgress(stderr, st.Model+" on "+pool)
	t := time.NewTicker(pullPollInterval)
	defer t.Stop()
	for st.State == api.PullRunning {
		select {
		case <-ctx.Done():
			return &exitError{code: 130, err: fmt.Errorf("stopped following pull %s; it goes on at the hive of pool %s", st.ID, pool)}
		case <-t.C:
		}
		pulls, err := c.ModelPulls(ctx, pool)
		if err != nil {
			return err
		}
		found := false
		for _, q := range pulls {
			if q.ID == st.ID {
				st, found = q, true
			}
		}
		if !found {
			return fmt.Errorf("the hive of pool %s no longer knows pull %s (did it restart?)", pool, st.ID)
		}
		if st.State == api.PullRunning && st.TotalBytes != 0 {
			p.report(modelstore.Progress{Written: st.WrittenBytes, Resumed: st.ResumedBytes, Total: st.TotalBytes})
		}
	}
	if st.State == api.PullFailed {
		return fmt.Errorf("pull of %s on pool %s failed: %s", st.Ref, pool, st.Error)
	}
	p.report(modelstore.Progress{Written: st.WrittenBytes, Resumed: st.ResumedBytes, Total: st.TotalBytes})
	p.done()
	return printLine(stdout, "pulled %s on pool %s (%s)", st.Model, pool, api.FormatBytes(uint64(st.WrittenBytes)))
}

// printPulls writes the table of `models pull --pool P --status`.
func printPulls(w io.Writer, pulls []api.ModelPull) error {
	t := newTable(w, "ID", "MODEL", "STATE", "WRITTEN", "TOTAL", "STARTED", "REF", "ERROR")
	for _, q := range pulls {
		total := "-"
		if q.TotalBytes >= 0 {
			total = api.FormatBytes(uint64(q.TotalBytes))
		}
		t.row(q.ID, q.Model, q.State, api.FormatBytes(uint64(q.WrittenBytes)), total, q.StartedAt.Local().Format(time.DateTime), q.Ref, oneLine(q.Error, 80))
	}
	return t.flush()
}

// printPoolModels writes the table of `models ls --all`: NAME is the
// name the queen's config gives a file ("-": none).
func printPoolModels(w io.Writer, pools []api.PoolModels) error {
	t := newTable(w, "POOL", "NAME", "REF", "ARCH", "SIZE")
	for _, p := range pools {
		if len(p.Models) == 0 {
			t.row(p.PoolID, "-", "-", "-", "-")
		}
		for _, m := range p.Models {
			t.row(p.PoolID, orDash(strings.Join(m.Names, ", ")), m.Ref, orDash(m.Architecture), api.FormatBytes(uint64(m.SizeBytes)))
		}
	}
	return t.flush()
}

// errPoolFlags is the usage error of flags that do not go with --pool.
var errPoolFlags = errors.New("--models-dir does not go with --pool: the pool's hive pulls into its own models directory")
