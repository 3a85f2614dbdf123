package main

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/apiary-llm/apiary/internal/api"
)

func newNodesCmd() *cobra.Command {
	a := &adminFlags{}
	cmd := groupCmd("nodes", "Add, list and remove SSH nodes",
		`Add, list and remove the machines the queen starts hives on over SSH. The
queen runs the system ssh (BatchMode, host keys checked against known_hosts,
your ssh config or the queen's --ssh-config), copies apiary to the node when it
is missing or another build, and starts 'apiary hive' there; the SSH session is
the hive's lifeline: when the queen stops or dies, the hive stops its workers
and exits. Uses $APIARY_ADMIN_TOKEN.`,
		newNodesAddCmd(a), newNodesLsCmd(a), newNodesRmCmd(a))
	a.register(cmd)
	return cmd
}

func newNodesAddCmd(a *adminFlags) *cobra.Command {
	var req api.AddNodeRequest
	var port int
	cmd := &cobra.Command{
		Use:   "add NAME --ssh USER@HOST[:PORT] [--install-dir DIR] [--hive-port N] [--tls-cert FILE --tls-key FILE --node-ca-file FILE]",
		Short: "Probe a node over SSH, save it and start a hive there",
		Long: `Probe the node over SSH (clear errors for a timeout, an unknown host key, a
refused key, a missing binary), save it, and start a hive there whose pool id
is NAME. apiary is copied to --install-dir on the node (default ~/.local/bin)
when it is missing or another build.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Name = args[0]
			if req.SSH == "" {
				return usagef("nodes add: --ssh USER@HOST[:PORT] is required")
			}
			if cmd.Flags().Changed("hive-port") {
				req.HivePort = &port
			}
			c := a.client()
			c.SetTimeout(5 * time.Minute) // the probe may wait for ssh's timeouts
			n, err := c.AddNode(cmd.Context(), req)
			if err != nil {
				return err
			}
			if a.asJSON {
				return printJSON(cmd.OutOrStdout(), n)
			}
			return printLine(cmd.OutOrStdout(), "node %s added (%s); its hive: %s", n.Name, n.SSH, n.Hive.State)
		},
	}
	cmd.Flags().StringVar(&req.SSH, "ssh", "", "USER@HOST[:PORT] of the node's sshd (required)")
	cmd.Flags().StringVar(&req.InstallDir, "install-dir", "", "where apiary lives on the node (default ~/.local/bin)")
	cmd.Flags().IntVar(&port, "hive-port", 9200, "port of the hive on the node (0: any free port)")
	cmd.Flags().StringVar(&req.Reason, "reason", "", "why, for the audit log")
	cmd.Flags().StringVar(&req.TLSCert, "tls-cert", "", "certificate file on the node for its hive and workers (required when the queen serves TLS)")
	cmd.Flags().StringVar(&req.TLSKey, "tls-key", "", "key file on the node of --tls-cert")
	cmd.Flags().StringVar(&req.CAFile, "node-ca-file", "", "CA file on the node that its hive trusts (the cluster's CA)")
	return cmd
}

func newNodesLsCmd(a *adminFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List nodes and the state of their hives",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			nodes, err := a.client().Nodes(cmd.Context())
			if err != nil {
				return err
			}
			if a.asJSON {
				return printJSON(cmd.OutOrStdout(), api.NodeList{Nodes: nodes})
			}
			if len(nodes) == 0 {
				// Nodes are the machines the queen starts hives on (over
				// SSH); hives an operator started are pools.
				_, err := fmt.Fprintln(cmd.ErrOrStderr(), "no node: the queen starts hives on none (apiary nodes add NAME --ssh HOST); hives started by an operator are pools: apiary pools ls")
				return err
			}
			return printNodes(cmd.OutOrStdout(), nodes, time.Now())
		},
	}
}

func newNodesRmCmd(a *adminFlags) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "rm NAME [--reason TEXT]",
		Short: "Stop the node's hive (its workers first) and forget the node",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := a.client()
			c.SetTimeout(5 * time.Minute) // the hive's cascade
			n, err := c.RemoveNode(cmd.Context(), args[0], reason)
			if err != nil {
				return err
			}
			if a.asJSON {
				return printJSON(cmd.OutOrStdout(), n)
			}
			return printLine(cmd.OutOrStdout(), "node %s removed; its hive: %s", n.Name, n.Hive.State)
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit log")
	return cmd
}

// printNodes writes the table of `apiary nodes ls`.
func printNodes(w io.Writer, nodes []api.Node, now time.Time) error {
	t := newTable(w, "NODE", "SSH", "HIVE", "SINCE", "PID", "STARTS", "ADDRESS", "INSTALL DIR", "MESSAGE")
	for _, n := range nodes {
		ssh := n.SSH
		if n.Local {
			ssh = "(local)"
		}
		pid := "-"
		if n.Hive.PID > 0 {
			pid = fmt.Sprint(n.Hive.PID)
		}
		t.row(n.Name, ssh, n.Hive.State, age(now, n.Hive.Since), pid,
			strconv.Itoa(n.Hive.Starts), orDash(n.Hive.NodeAddr), orDash(n.InstallDir), oneLine(orDash(n.Hive.Message), 70))
	}
	return t.flush()
}
