package main

import (
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/apiary-llm/apiary/internal/api"
)

func newAuditCmd() *cobra.Command {
	a := &adminFlags{}
	var since string
	var limit int
	cmd := &cobra.Command{
		Use:   "audit [--since DURATION] [--limit N]",
		Short: "Show the audit log, newest first",
		Long: `Show the queen's audit log, newest first: every change to a pool or a worker
lifecycle row, with who made it and why. --since takes a duration (1h, 30m)
or an RFC 3339 time. Uses $APIARY_ADMIN_TOKEN.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if since != "" {
				if _, err := time.ParseDuration(since); err != nil {
					if _, err := time.Parse(time.RFC3339Nano, since); err != nil {
						return usagef("audit: --since %q: want a duration (1h, 30m) or an RFC 3339 time", since)
					}
				}
			}
			if limit < 0 {
				return usagef("audit: --limit must not be negative, got %d", limit)
			}
			entries, err := a.client().Audit(cmd.Context(), since, limit)
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
	cmd.Flags().StringVar(&since, "since", "", "only entries this recent (duration) or since this time (RFC 3339)")
	cmd.Flags().IntVar(&limit, "limit", 0, "at most this many entries (default 100)")
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
