package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
)

func newPoolsCmd() *cobra.Command {
	a := &adminFlags{}
	cmd := groupCmd("pools", "List, drain, undrain and remove pools",
		`List, drain, undrain and remove the pools (hives) registered with the queen. A
drained pool gets no new workers (its running workers serve on until they
stop or idle out; drain --now stops them) until it is undrained; a removed pool is offline until its hive registers again. Uses $APIARY_ADMIN_TOKEN ($APIARY_CLUSTER_TOKEN may list pools).`,
		newPoolsLsCmd(a), newPoolsDrainCmd(a), newPoolsUndrainCmd(a), newPoolsRmCmd(a))
	a.register(cmd)
	return cmd
}

func newPoolsLsCmd(a *adminFlags) *cobra.Command {
	var f keeper.PoolFilter
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List pools",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			pools, err := a.client().Pools(cmd.Context(), f)
			if err != nil {
				return err
			}
			if a.asJSON {
				return printJSON(cmd.OutOrStdout(), api.PoolList{Pools: pools})
			}
			return printPools(cmd.OutOrStdout(), pools, time.Now())
		},
	}
	cmd.Flags().StringVar(&f.Status, "status", "", "only pools of these statuses (comma-separated: healthy, unhealthy, draining, offline)")
	cmd.Flags().StringVar(&f.Model, "model", "", "only pools with a live worker of this model (a configured name or alias, or a ref)")
	cmd.Flags().Uint64Var(&f.MinVRAMBytes, "min-vram-bytes", 0, "only pools with a device with at least this much free memory")
	return cmd
}

func newPoolsDrainCmd(a *adminFlags) *cobra.Command {
	var now bool
	cmd := newPoolActionCmd(a, "drain POOL_ID --reason TEXT [--now]",
		"Drain a pool: it gets no new workers; its running workers serve on until they stop or idle out (--now: stopped gracefully now)",
		func(c *keeper.Client, ctx context.Context, id, reason string) (api.Pool, error) {
			return c.DrainPoolNow(ctx, id, reason, now)
		})
	cmd.Flags().BoolVar(&now, "now", false, "also stop the pool's running workers now, gracefully (requests in flight finish)")
	return cmd
}

func newPoolsUndrainCmd(a *adminFlags) *cobra.Command {
	return newPoolActionCmd(a, "undrain POOL_ID --reason TEXT", "Take a drained pool back: it gets new workers again",
		(*keeper.Client).UndrainPool)
}

func newPoolsRmCmd(a *adminFlags) *cobra.Command {
	return newPoolActionCmd(a, "rm POOL_ID --reason TEXT", "Deregister a pool (offline; its hive may register again)",
		(*keeper.Client).RemovePool)
}

// newPoolActionCmd is a `pools` subcommand that changes one pool's status
// with action (a reason goes to the audit log) and prints the new status.
func newPoolActionCmd(a *adminFlags, use, short string,
	action func(c *keeper.Client, ctx context.Context, id, reason string) (api.Pool, error)) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := action(a.client(), cmd.Context(), args[0], reason)
			if err != nil {
				return err
			}
			if a.asJSON {
				return printJSON(cmd.OutOrStdout(), p)
			}
			return printLine(cmd.OutOrStdout(), "%s: %s", p.PoolID, p.Status)
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit log (required)")
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		if strings.TrimSpace(reason) == "" {
			return usagef("pools %s: --reason is required (it goes to the audit log)", c.Name())
		}
		return nil
	}
	return cmd
}

// printPools writes the table of `apiary pools ls`.
func printPools(w io.Writer, pools []api.Pool, now time.Time) error {
	t := newTable(w, "POOL", "STATUS", "ENDPOINT", "VERSION", "DEVICES", "MOST FREE", "WORKERS", "LOADED (LAST USE)", "LAST EVICTION", "LAST BEAT", "PULLING")
	for _, p := range pools {
		var free uint64
		for _, g := range p.GPUs {
			free = max(free, g.FreeBytes)
		}
		beat := "-"
		if p.LastHeartbeatAt != nil {
			beat = age(now, *p.LastHeartbeatAt) + " ago"
		}
		workers := strconv.Itoa(len(p.Workers))
		if p.MaxLoaded > 0 {
			workers += fmt.Sprintf(" (max %d)", p.MaxLoaded)
		}
		t.row(p.PoolID, p.Status, p.Endpoint, orDash(p.Version),
			devicesCell(p.GPUs), api.FormatBytes(free), workers, loadedCell(p.Workers, now), evictionCell(p.Evictions, now), beat, pulling(p.Pulls))
	}
	return t.flush()
}

// loadedCell is what a pool's live workers run (by the names the
// queen's config gives them), with when each last served a request
// through the queen: "bees 3s ago, b unused".
func loadedCell(ws []api.Worker, now time.Time) string {
	var parts []string
	for _, w := range ws {
		if w.StoppedAt != nil {
			continue
		}
		used := "unused"
		if w.LastUsedAt != nil {
			used = age(now, *w.LastUsedAt) + " ago"
		}
		parts = append(parts, cmp.Or(w.ModelName, w.ModelRef)+" "+used)
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// evictionCell is a pool's latest eviction, by the names the queen's
// config gives the models: "bees for b 2m ago".
func evictionCell(evs []api.Eviction, now time.Time) string {
	if len(evs) == 0 {
		return "-"
	}
	e := evs[0]
	return fmt.Sprintf("%s for %s %s ago", cmp.Or(e.ModelName, e.Model), cmp.Or(e.ForName, e.For), age(now, e.At))
}

// devicesCell is a pool's device count for a table, with how many of
// them no worker can use ("2 (1 unusable)"); `pools ls --json` has why.
func devicesCell(gpus []api.GPU) string {
	n := 0
	for _, g := range gpus {
		if g.Unusable != "" {
			n++
		}
	}
	if n == 0 {
		return strconv.Itoa(len(gpus))
	}
	return fmt.Sprintf("%d (%d unusable)", len(gpus), n)
}

// pulling is a pool's running pulls for a table: "MODEL 42%" each (the
// bytes written while the size is not known yet), or "-".
func pulling(pulls []api.ModelPull) string {
	if len(pulls) == 0 {
		return "-"
	}
	parts := make([]string, 0, len(pulls))
	for _, p := range pulls {
		switch {
		case p.TotalBytes > 0:
			parts = append(parts, fmt.Sprintf("%s %d%%", p.Model, p.WrittenBytes*100/p.TotalBytes))
		default:
			parts = append(parts, fmt.Sprintf("%s %s", p.Model, api.FormatBytes(uint64(max(p.WrittenBytes, 0)))))
		}
	}
	return strings.Join(parts, ", ")
}
