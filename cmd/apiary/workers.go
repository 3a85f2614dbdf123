package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/secret"
	"github.com/apiary-llm/apiary/internal/transport"
)

// adminFlags are the flags every admin command shares.
type adminFlags struct {
	queen  string
	asJSON bool
}

func (a *adminFlags) register(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&a.queen, "queen", defaultQueenURL(), queenFlagUsage)
	cmd.PersistentFlags().BoolVar(&a.asJSON, "json", false, "print JSON instead of a table")
	root := cmd.PersistentPreRunE
	cmd.PersistentPreRunE = func(c *cobra.Command, args []string) error {
		if _, err := transport.BaseURLs("--queen", a.queen); err != nil {
			return usagef("%v", err)
		}
		if root != nil {
			return root(c, args)
		}
		if pre := c.Root().PersistentPreRunE; pre != nil {
			return pre(c, args) // cobra runs only the nearest hook
		}
		return nil
	}
}

// client is the admin client with the tokens of the environment.
func (a *adminFlags) client() *keeper.Client {
	return keeper.NewClient(a.queen, os.Getenv(secret.AdminTokenEnv), os.Getenv(secret.ClusterTokenEnv))
}

// groupCmd is a command that only holds subcommands.
func groupCmd(use, short, long string, subs ...*cobra.Command) *cobra.Command {
	cmd := &cobra.Command{
		Use: use, Short: short, Long: long,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var names []string
			for _, s := range subs {
				names = append(names, s.Name())
			}
			if len(args) > 0 {
				return usagef("unknown command %q for %q (want %s)", args[0], cmd.CommandPath(), strings.Join(names, ", "))
			}
			return usagef("%s: missing command (%s)", cmd.CommandPath(), strings.Join(names, ", "))
		},
	}
	cmd.AddCommand(subs...)
	return cmd
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newWorkersCmd() *cobra.Command {
	a := &adminFlags{}
	cmd := groupCmd("workers", "List, start and stop workers, and read their logs",
		`List, start and stop workers through the queen's lifecycle rows, and read
their logs. Every start and stop needs --reason: it goes to the audit log.
Uses $APIARY_ADMIN_TOKEN.`,
		newWorkersLsCmd(a), newWorkersStartCmd(a), newWorkersCreateCmd(a), newWorkersStopCmd(a), newWorkersLogsCmd(a))
	a.register(cmd)
	return cmd
}

func newWorkersLsCmd(a *adminFlags) *cobra.Command {
	var f keeper.WorkerFilter
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List lifecycle rows, newest first",
		Long: `List lifecycle rows, newest first. Above them, a line per model pull under
way on a pool (status PULLING; the pools' pulls of GET /v2/pools), such as
the queen's pull of a configured model that a waiting request or replica
needs: its percent and source are in REASON. --status, --model and --pool
select pulls too; --json prints the rows only.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c := a.client()
			rows, err := c.Workers(cmd.Context(), f)
			if err != nil {
				return err
			}
			if a.asJSON {
				return printJSON(cmd.OutOrStdout(), api.LifecycleRowList{Workers: rows})
			}
			var pulls []api.ModelPull
			if statusSelects(f.Status, statusPulling) {
				pools, err := c.Pools(cmd.Context(), keeper.PoolFilter{})
				if err != nil {
					_ = printLine(cmd.ErrOrStderr(), "apiary: the pulls under way are unknown: %v", err)
				}
				pulls = poolPulls(pools, f)
			}
			return printWorkers(cmd.OutOrStdout(), pulls, rows, time.Now())
		},
	}
	cmd.Flags().StringVar(&f.Status, "status", "", "only rows of these statuses (comma-separated: STARTING, RUNNING, DRAINING, STOPPED, FAILED)")
	cmd.Flags().StringVar(&f.Model, "model", "", "only rows of this model (a configured name or alias, or a ref)")
	cmd.Flags().StringVar(&f.PoolID, "pool", "", "only rows of this pool")
	cmd.Flags().IntVar(&f.Limit, "limit", 0, "at most this many rows (default 100)")
	return cmd
}

func newWorkersStartCmd(a *adminFlags) *cobra.Command {
	var model, pool, reason string
	var gpu int
	cmd := &cobra.Command{
		Use:   "start --model NAME [--pool ID] [--gpu N] --reason TEXT",
		Short: "Start a worker",
		Long: `Start a worker of model NAME (a name or alias of the queen's --config, or a
model ref: a GGUF file name without .gguf): the queen writes a STARTING lifecycle row and asks
the pool's hive to start it. Without --pool the queen picks the healthy pool
with the most free memory. Prints the lifecycle id.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if model == "" {
				return usagef("workers start: --model is required")
			}
			if strings.TrimSpace(reason) == "" {
				return usagef("workers start: --reason is required (it goes to the audit log)")
			}
			var g *int
			if cmd.Flags().Changed("gpu") {
				if gpu < 0 {
					return usagef("workers start: --gpu must not be negative, got %d", gpu)
				}
				g = &gpu
			}
			resp, err := a.client().StartWorker(cmd.Context(), model, pool, g, reason)
			if err != nil {
				return err
			}
			return a.printStarted(cmd, resp)
		},
	}
	cmd.Flags().StringVar(&model, "model", "", "model: a name or alias of the queen's --config, or the GGUF file name in the hive's models dir without .gguf (required)")
	cmd.Flags().StringVar(&pool, "pool", "", "pool to start on (default: the queen picks)")
	cmd.Flags().IntVar(&gpu, "gpu", 0, "device to start on (default: the hive picks)")
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit log (required)")
	return cmd
}

func newWorkersCreateCmd(a *adminFlags) *cobra.Command {
	var model, pool, placement, reason string
	cmd := &cobra.Command{
		Use:   "create --model NAME --placement auto|operator [--pool ID] --reason TEXT",
		Short: "Create a worker's lifecycle row",
		Long: `Create a STARTING lifecycle row for a worker of model NAME (a name or alias
of the queen's --config, or a GGUF file name without .gguf). With --placement auto
the queen places the worker (on --pool, or the healthy pool with the most free
memory) and asks the pool's hive to start it, as workers start does. With
--placement operator the row waits for a worker you run by hand to claim it:

  APIARY_CLUSTER_TOKEN=… apiary worker --model PATH --queen URL --lifecycle-id ID

(anywhere that reaches the queen); a row no worker claims within the queen's
--claim-timeout is FAILED (unclaimed). Prints the lifecycle id.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case model == "":
				return usagef("workers create: --model is required")
			case placement != api.PlacementAuto && placement != api.PlacementOperator:
				return usagef("workers create: --placement must be %s or %s, got %q", api.PlacementAuto, api.PlacementOperator, placement)
			case placement == api.PlacementOperator && pool != "":
				return usagef("workers create: --pool belongs to --placement %s: a worker run by hand claims its row wherever it runs", api.PlacementAuto)
			case strings.TrimSpace(reason) == "":
				return usagef("workers create: --reason is required (it goes to the audit log)")
			}
			resp, err := a.client().CreateWorker(cmd.Context(), model, placement, pool, reason)
			if err != nil {
				return err
			}
			return a.printStarted(cmd, resp)
		},
	}
	cmd.Flags().StringVar(&model, "model", "", "model: a name or alias of the queen's --config, or a GGUF file name without .gguf (required)")
	cmd.Flags().StringVar(&placement, "placement", api.PlacementAuto, "auto: the queen places and starts the worker; operator: the row waits for a worker run by hand")
	cmd.Flags().StringVar(&pool, "pool", "", "with --placement auto: pool to start on (default: the queen picks)")
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit log (required)")
	return cmd
}

func newWorkersStopCmd(a *adminFlags) *cobra.Command {
	var reason string
	var drain bool
	cmd := &cobra.Command{
		Use:   "stop LIFECYCLE_ID [--drain] --reason TEXT",
		Short: "Stop a worker",
		Long: `Stop the worker of a lifecycle row: the queen asks its hive to stop it and the
row becomes DRAINING, then STOPPED when the hive reports it gone. --drain lets
in-flight requests finish first.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(reason) == "" {
				return usagef("workers stop: --reason is required (it goes to the audit log)")
			}
			if !api.IsLifecycleID(args[0]) {
				return usagef("workers stop: %q is not a lifecycle id: give the wk-… id (wk- and 16 hex digits) that apiary workers ls shows", args[0])
			}
			resp, err := a.client().StopWorker(cmd.Context(), args[0], drain, reason)
			if err != nil {
				return err
			}
			if a.asJSON {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			return printLine(cmd.OutOrStdout(), "%s: %s", resp.LifecycleID, resp.Worker.Status)
		},
	}
	cmd.Flags().BoolVar(&drain, "drain", false, "let in-flight requests finish before the worker stops")
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit log (required)")
	return cmd
}

func newWorkersLogsCmd(a *adminFlags) *cobra.Command {
	var q api.LogQuery
	cmd := &cobra.Command{
		Use:   "logs LIFECYCLE_ID [--follow] [--tail N]",
		Short: "Print a worker's log",
		Long: `Print the log (stdout and stderr) of a lifecycle row's worker, live or ended,
as the queen reads it from the worker's hive: the end of it, at most 1 MiB of
whole lines, or its last --tail N lines (at most 10000). --follow then prints
each new line as the worker writes it, until the worker ends (or Ctrl+C).
Control characters show as escapes such as \x1b.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			if a.asJSON {
				return usagef("workers logs: --json does not apply: a log is text")
			}
			if !api.IsLifecycleID(id) {
				return usagef("workers logs: %q is not a lifecycle id: give the wk-… id (wk- and 16 hex digits) that apiary workers ls shows", id)
			}
			if cmd.Flags().Changed("tail") && (q.Tail < 1 || q.Tail > api.MaxLogTail) {
				return usagef("workers logs: --tail must be from 1 to %d, got %d", api.MaxLogTail, q.Tail)
			}
			out := &textWriter{w: cmd.OutOrStdout()}
			err := a.client().WorkerLogs(cmd.Context(), id, q, out)
			return errors.Join(err, out.Flush())
		},
	}
	cmd.Flags().BoolVarP(&q.Follow, "follow", "f", false, "print new lines as they come, until the worker ends")
	cmd.Flags().IntVar(&q.Tail, "tail", 0, "only the last N lines (1-10000; default: all, up to 1 MiB)")
	return cmd
}

// printRows writes the table of `apiary workers ls`; a worker the
// queen's routing degraded (its strikes) shows as "RUNNING (degraded)".
func printRows(w io.Writer, rows []api.LifecycleRow, now time.Time) error {
	return printWorkers(w, nil, rows, now)
}

// statusPulling is the status `workers ls` shows a pull under way with.
const statusPulling = "PULLING"

// statusSelects reports whether the --status list (comma-separated, ""
// for all) holds status.
func statusSelects(list, status string) bool {
	if list == "" {
		return true
	}
	for s := range strings.SplitSeq(list, ",") {
		if strings.EqualFold(strings.TrimSpace(s), status) {
			return true
		}
	}
	return false
}

// poolPulls returns the pulls under way on pools that f's model and pool
// select, by pool then model.
func poolPulls(pools []api.Pool, f keeper.WorkerFilter) []api.ModelPull {
	var out []api.ModelPull
	for _, p := range pools {
		for _, mp := range p.Pulls {
			if mp.State != api.PullRunning || f.Model != "" && mp.Model != f.Model || f.PoolID != "" && p.PoolID != f.PoolID {
				continue
			}
			mp.PoolID = p.PoolID
			out = append(out, mp)
		}
	}
	return out
}

// printWorkers writes the table of `apiary workers ls`: a line per pull
// under way (status PULLING), then the lifecycle rows.
func printWorkers(w io.Writer, pulls []api.ModelPull, rows []api.LifecycleRow, now time.Time) error {
	// Workers that are Kubernetes Pods (queen --kubernetes) get a POD
	// column.
	pods := slices.ContainsFunc(rows, func(r api.LifecycleRow) bool { return r.Pod != "" })
	cols := []string{"ID", "STATUS", "MODEL", "POOL", "DEVICE", "VRAM", "AGE", "OWNER", "REASON"}
	if pods {
		cols = slices.Insert(cols, 5, "POD")
	}
	t := newTable(w, cols...)
	row := func(cells ...string) {
		if !pods {
			cells = slices.Delete(cells, 5, 6)
		}
		t.row(cells...)
	}
	for _, p := range pulls {
		row(orDash(p.ID), statusPulling, p.Model, p.PoolID, "-", "-", "-", age(now, p.StartedAt), "-", oneLine(pullProgress(p), 60))
	}
	for _, r := range rows {
		gpu := deviceName(r)
		vram := "-"
		if r.VRAMBytes > 0 {
			vram = api.FormatBytes(r.VRAMBytes)
		}
		status := r.Status
		if r.Strikes != nil && r.Strikes.Degraded {
			status += " (degraded)"
		}
		row(r.ID, status, modelShown(r.ModelName, r.ModelRef), r.PoolID, gpu, orDash(r.Pod), vram, age(now, r.CreatedAt), r.Owner, oneLine(r.Reason, 60))
	}
	return t.flush()
}

// deviceName is a row's device for a table: cpu, gpu N, or the bare
// number when its pool no longer says which kind it is.
func deviceName(r api.LifecycleRow) string {
	switch {
	case r.GPUDevice == nil:
		return "-"
	case r.Node != "":
		// A Kubernetes Pod: its device, on its node.
		node := r.Node
		r.Node = ""
		return deviceName(r) + " on " + node
	case len(r.GPUDevices) > 1:
		return "gpus " + joinInts(r.GPUDevices) // a split over several
	case r.DeviceKind == api.DeviceCPU:
		return "cpu"
	case r.DeviceKind != "":
		return "gpu " + strconv.Itoa(*r.GPUDevice)
	}
	return strconv.Itoa(*r.GPUDevice)
}

// age is how long ago t was, short: 45s, 12m, 3h, 2d.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// oneLine shortens s to one line of at most n runes for a table.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return orDash(s)
}

// printStarted prints the row a start or a create made: its lifecycle id
// on stdout (for scripts), what it is on stderr; or the answer as JSON.
func (a *adminFlags) printStarted(cmd *cobra.Command, resp api.AdminWorkerResponse) error {
	if a.asJSON {
		return printJSON(cmd.OutOrStdout(), resp)
	}
	if err := printLine(cmd.OutOrStdout(), "%s", resp.LifecycleID); err != nil {
		return err
	}
	return printLine(cmd.ErrOrStderr(), "%s: %s on pool %s (%s)", resp.LifecycleID, resp.Worker.Status, resp.Worker.PoolID,
		modelShown(resp.Worker.ModelName, resp.Worker.ModelRef))
}

// modelShown is a model for a person: the name the queen's config gives
// it with its file beside it ("bees (tiny)"), or its file when the
// config names none.
func modelShown(name, ref string) string {
	if name == "" || name == ref {
		return ref
	}
	return name + " (" + ref + ")"
}

// pullProgress is how far a pull is, for a table: "42% of 4.1 GiB from
// REF", or the bytes written while the size is not known yet.
func pullProgress(p api.ModelPull) string {
	if p.TotalBytes > 0 {
		return fmt.Sprintf("%d%% of %s from %s", p.WrittenBytes*100/p.TotalBytes, api.FormatBytes(uint64(p.TotalBytes)), p.Ref)
	}
	return fmt.Sprintf("%s from %s", api.FormatBytes(uint64(max(p.WrittenBytes, 0))), p.Ref)
}
