package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/apiary-llm/apiary/internal/hive"
	"github.com/apiary-llm/apiary/internal/service"
)

var serviceFields = map[string]string{
	"Role": "the role", "Binary": "this binary's path", "User": "--user", "DataDir": "--data-dir",
	"ModelsDir": "--models-dir", "EnvFile": "--env-file", "StopTimeout": "the stop timeout", "Watchdog": "--watchdog", "Args": "the daemon's flags",
}

// stopMargin is what TimeoutStopSec adds to a daemon's own stop budget.
const stopMargin = 30 * time.Second

func newServiceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "service",
		Short: "Install the queen or the hive as a systemd service",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			return usagef("missing command: install or uninstall (see apiary service --help)")
		},
	}
	cmd.AddCommand(newServiceInstallCmd(), newServiceUninstallCmd())
	return cmd
}

type serviceFlags struct {
	user, dataDir, modelsDir, unitDir, envFile string
	installDir                                 string
	dryRun, now                                bool
	watchdog                                   time.Duration
}

func newServiceInstallCmd() *cobra.Command {
	f := &serviceFlags{}
	cmd := &cobra.Command{
		Use:   "install queen|hive [flags] [-- daemon flags]",
		Short: "Write the systemd unit of a queen or a hive",
		Long: `Write apiary-queen.service or apiary-hive.service: the daemon runs as a
dedicated user (created with useradd --system when missing), with this
binary's absolute path and the flags after --, hardened (read-only system,
no home, private /tmp, writable only its data and models directories),
Type=notify with a watchdog, restarted on failure. On stop the main process
alone gets SIGTERM and stops its own children (a hive its workers); what is
left after TimeoutStopSec (above the daemon's own stop budget) is killed.

Tokens go in the environment file (--env-file, mode 0600, created with the
variables' names only, or kept), never in the unit.

--dry-run prints the unit and changes nothing. Without --now it does not run
systemctl: it prints the line to run.`,
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			role, err := service.ParseRole(args[0])
			if err != nil {
				return usagef("%v", err)
			}
			extra := args[1:]
			if dash := cmd.ArgsLenAtDash(); dash < 0 && len(extra) > 0 {
				return usagef("unexpected %q: the daemon's flags go after --", extra[0])
			} else if dash > 1 {
				return usagef("unexpected %q: the daemon's flags go after --", args[1])
			}
			stop, reload, err := daemonStopBudget(role, extra)
			if err != nil {
				return err
			}
			bin, err := os.Executable()
			if err == nil {
				bin, err = filepath.EvalSymlinks(bin)
			}
			if err != nil {
				return fmt.Errorf("this binary's path: %w", err)
			}
			u := service.Unit{Role: role, Binary: bin, User: f.user, DataDir: f.dataDir, ModelsDir: f.modelsDir,
				EnvFile: f.envFile, Args: extra, StopTimeout: stop + stopMargin, Watchdog: f.watchdog, Reload: reload}
			if f.watchdog <= 0 {
				u.Watchdog = -1 // none
			}
			for _, p := range []*string{&u.DataDir, &u.ModelsDir, &u.EnvFile} {
				if *p != "" {
					if *p, err = filepath.Abs(*p); err != nil {
						return usagef("%v", err)
					}
				}
			}
			// A unit systemd runs gets a binary (and its libraries) where
			// the sandbox lets it see them, and only paths it can see.
			real := filepath.Clean(f.unitDir) == service.DefaultUnitDir || cmd.Flags().Changed("install-dir")
			if real && filepath.Dir(bin) != filepath.Clean(f.installDir) {
				u.Binary = filepath.Join(f.installDir, "apiary")
			}
			u = u.WithDefaults()
			if err := u.Validate(); err != nil {
				return configError(err, serviceFields)
			}
			if real {
				if err := u.CheckSandbox(); err != nil {
					return configError(err, serviceFields)
				}
			}
			if f.dryRun {
				if u.Binary != bin {
					fmt.Fprintf(cmd.ErrOrStderr(), "would copy %s and its libraries to %s\n", bin, filepath.Dir(u.Binary))
				}
				_, err := fmt.Fprint(cmd.OutOrStdout(), u.Render())
				return err
			}
			in := service.Installer{Unit: u, UnitDir: f.unitDir, Now: f.now, Out: cmd.OutOrStdout()}
			err = in.Preflight()
			if err == nil && u.Binary != bin {
				err = service.InstallBinary(bin, filepath.Dir(u.Binary), cmd.OutOrStdout())
			}
			if err == nil {
				err = in.Install(cmd.Context())
			}
			if errors.Is(err, service.ErrNeedsRoot) {
				return fmt.Errorf("%w; run it as root (sudo), or --dry-run to print the unit, or --unit-dir DIR (with --user NAME of an existing user) to write it elsewhere", err)
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.user, "user", service.DefaultUser, "user the daemon runs as (created with useradd --system when missing)")
	fl.StringVar(&f.dataDir, "data-dir", "", "the daemon's data directory (default /var/lib/apiary/ROLE)")
	fl.StringVar(&f.modelsDir, "models-dir", "", "the hive's models directory (default "+service.DefaultModelsDir+")")
	fl.StringVar(&f.unitDir, "unit-dir", service.DefaultUnitDir, "directory the unit file is written to")
	fl.StringVar(&f.installDir, "install-dir", service.DefaultInstallDir, "where this binary and its libraries are copied for the service (a path its sandbox lets it see); with --unit-dir, only when given")
	fl.StringVar(&f.envFile, "env-file", "", "file of the daemon's tokens, KEY=VALUE lines, mode 0600 (default /etc/apiary/ROLE.env)")
	fl.DurationVar(&f.watchdog, "watchdog", service.DefaultWatchdog, "WatchdogSec: systemd restarts the daemon when it misses its pings this long (0: no watchdog)")
	fl.BoolVar(&f.dryRun, "dry-run", false, "print the unit; create and write nothing")
	fl.BoolVar(&f.now, "now", false, "then run systemctl daemon-reload and enable --now")
	return cmd
}

// daemonStopBudget checks the daemon's flags (extra) as the daemon would
// parse them and returns how long its own stop may take: for a hive, a
// worker's shutdown ack, its grace and SIGTERM→SIGKILL, then the last
// events and the server (2s each); for a queen, its hives' stop timeout
// and its server's and flush's 10s each. reload says whether the daemon
// reloads on SIGHUP (a queen with --config).
func daemonStopBudget(role service.Role, extra []string) (budget time.Duration, reload bool, err error) {
	var c *cobra.Command
	if role == service.Queen {
		c = newQueenCmd()
	} else {
		c = newHiveCmd()
	}
	if err := c.ParseFlags(extra); err != nil {
		return 0, false, usagef("the %s's flags after --: %v", role, err)
	}
	if c.Flags().NArg() > 0 {
		return 0, false, usagef("the %s's flags after --: unexpected %q", role, c.Flags().Arg(0))
	}
	for _, name := range []string{"data-dir", "models-dir", "lifeline", "owner"} {
		if fl := c.Flags().Lookup(name); fl != nil && fl.Changed {
			if name == "data-dir" || name == "models-dir" {
				return 0, false, usagef("--%s goes before --, to apiary service install (it sets the unit's writable paths)", name)
			}
			return 0, false, usagef("--%s is not for a service: a service runs as the operator's daemon", name)
		}
	}
	dur := func(name string) time.Duration {
		d, _ := c.Flags().GetDuration(name)
		return d
	}
	if role == service.Queen {
		return dur("hive-stop-timeout") + 20*time.Second, c.Flags().Changed("config"), nil
	}
	ack, grace := dur("shutdown-ack"), dur("stop-grace")
	if ack <= 0 {
		ack = hive.DefaultShutdownAck
	}
	if grace <= 0 {
		grace = hive.DefaultStopGrace
	}
	return 2*ack + grace + 4*time.Second, false, nil
}

func newServiceUninstallCmd() *cobra.Command {
	var unitDir string
	var now bool
	cmd := &cobra.Command{
		Use:   "uninstall queen|hive",
		Short: "Remove the systemd unit of a queen or a hive (the user and the data are kept)",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			role, err := service.ParseRole(args[0])
			if err != nil {
				return usagef("%v", err)
			}
			err = service.Uninstall(cmd.Context(), role, unitDir, now, cmd.OutOrStdout())
			if errors.Is(err, service.ErrNeedsRoot) {
				return fmt.Errorf("%w; run it as root (sudo), or --unit-dir DIR where it was written", err)
			}
			return err
		},
	}
	cmd.Flags().StringVar(&unitDir, "unit-dir", service.DefaultUnitDir, "directory the unit file was written to")
	cmd.Flags().BoolVar(&now, "now", false, "first run systemctl disable --now, after systemctl daemon-reload")
	return cmd
}
