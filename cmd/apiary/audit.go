package main

import (
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
)

func newAuditCmd() *cobra.Command {
	a := &adminFlags{}
	var f keeper.AuditFilter
	cmd := &cobra.Command{
		Use:   "audit [--since WHEN] [--until WHEN] [--actor A] [--action A] [--target T] [--limit N]",
		Short: "Show the audit log, newest first",
		Long: `Show the queen's audit log, newest first: every change to a pool or a worker
lifecycle row, with who made it and why. --since and --until take a duration
ago (1h, 30m) or an RFC 3339 time; --actor (queen, operator, hive:ID …),
--action (worker.stop, pool.drain …) and --target (a lifecycle id, a pool id)
select exact values, as the dashboard's filters do. Uses $APIARY_ADMIN_TOKEN.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, w := range []struct{ flag, v string }{{"--since", f.Since}, {"--until", f.Until}} {
				if w.v == "" {
					continue
				}
				if _, err := time.ParseDuration(w.v); err != nil {
					if _, err := time.Parse(time.RFC3339Nano, w.v); err != nil {
						return usagef("audit: %s %q: want a duration ago (1h, 30m) or an RFC 3339 time", w.flag, w.v)
					}
				}
			}
			if f.Limit < 0 {
				return usagef("audit: --limit must not be negative, got %d", f.Limit)
			}
			entries, err := a.client().AuditQuery(cmd.Context(), f)
			if err != nil {
				return err
			}
			if a.asJSON {
				return printJSON(cmd.OutOrStdout(), api.AuditList{Entries: entries})
			}
			return printAudit(cmd.OutOrStdout(), entries)
		},
	}
	a.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&f.Since, "since", "", "only entries this recent (duration) or since this time (RFC 3339)")
	fl.StringVar(&f.Until, "until", "", "only entries older than this (duration ago) or until this time (RFC 3339)")
	fl.StringVar(&f.Actor, "actor", "", "only entries by this actor (queen, operator, hive:ID, …)")
	fl.StringVar(&f.Action, "action", "", "only entries of this action (worker.stop, pool.drain, …)")
	fl.StringVar(&f.Target, "target", "", "only entries about this target (a lifecycle id, a pool id)")
	fl.IntVar(&f.Limit, "limit", 0, "at most this many entries (default 100)")
	return cmd
}

// printAudit writes the table of `apiary audit`.
func printAudit(w io.Writer, entries []api.AuditEntry) error {
	t := newTable(w, "TIME", "ACTOR", "ACTION", "TARGET", "REASON")
	for _, e := range entries {
		t.row(e.TS.Local().Format("2006-01-02 15:04:05"), e.Actor, e.Action, e.Target, oneLine(e.Reason, 80))
	}
	return t.flush()
}
