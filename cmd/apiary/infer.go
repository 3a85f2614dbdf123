package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/apiary-llm/apiary/internal/config"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/secret"
)

func newInferCmd() *cobra.Command {
	cfg := keeper.InferConfig{}
	var debug bool
	cmd := &cobra.Command{
		Use:   "infer --model REF --prompt TEXT [--max-tokens N] [--node NAME [--ssh USER@HOST[:PORT] [--ssh-config FILE] [--install-dir DIR]]] [--queen URL | --ephemeral]",
		Short: "Answer a prompt (starting a throwaway queen and hive when none runs)",
		Long: `Answer one prompt, token by token on stdout; progress goes to stderr.

Persistent mode: a queen answers at --queen (default $APIARY_QUEEN or
http://127.0.0.1:8080). The prompt goes to it; the queen, its hives and
workers keep running afterwards. --model is then a model ref of the hives'
models dirs: a path is refused (the queen cannot load a file of this
machine). stderr names the queen it asks.

Ephemeral mode: no queen answers, or --ephemeral. apiary starts a queen with
a hive on this machine (free ports, a throwaway data dir), answers, then
stops everything it started; with --ephemeral it never asks --queen, so a
queen running there is left alone. --model is then a model ref from the
models dir ($XDG_DATA_HOME/apiary/models) or a path to a .gguf file.

Ctrl+C or SIGTERM at any moment stops what this command started (never a
queen it found running) and exits 130 or 143.

--node NAME pins the request to that node's pool. In persistent mode the
queen must know the node (apiary nodes add). In ephemeral mode give the
node's --ssh USER@HOST[:PORT] too: apiary starts a queen on the address of
this machine that the node sees, the queen starts a hive on the node over SSH
(copying apiary to --install-dir when it is missing or another build), the
prompt runs there, and the queen's stop takes the node's hive and worker
down with it. --model is then a ref of the node's models dir.
Tokens come from APIARY_API_TOKEN and APIARY_ADMIN_TOKEN.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Ephemeral && cmd.Flags().Changed("queen") {
				return usagef("infer: --ephemeral starts a queen of its own and --queen names one to ask: give one of them")
			}
			return runInfer(cmd, cfg, debug)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.Model, "model", "", "model ref (tiny), or a path to a .gguf file (required)")
	fl.StringVar(&cfg.Prompt, "prompt", "", "the prompt (required)")
	fl.IntVar(&cfg.MaxTokens, "max-tokens", 0, "longest answer in tokens (0: the worker's default)")
	fl.StringVar(&cfg.Node, "node", "", "serve the prompt on this node's pool only")
	fl.StringVar(&cfg.SSH, "ssh", "", "ephemeral mode with --node: USER@HOST[:PORT] of the node's sshd")
	fl.StringVar(&cfg.SSHConfig, "ssh-config", "", "ephemeral mode with --node: ssh client configuration file (ssh -F; default ~/.ssh/config)")
	fl.StringVar(&cfg.InstallDir, "install-dir", "", "ephemeral mode with --node: where apiary lives on the node (default ~/.local/bin)")
	fl.StringVar(&cfg.QueenURL, "queen", defaultQueenURL(), queenFlagUsage)
	fl.BoolVar(&cfg.Ephemeral, "ephemeral", false, "start a throwaway queen and hive for this prompt even when a queen answers at --queen (never asking it)")
	fl.StringVar(&cfg.ModelsDir, "models-dir", keeper.DefaultModelsDir(), "ephemeral mode: where a model ref is looked up")
	fl.IntVar(&cfg.WorkerThreads, "worker-threads", 0, "ephemeral mode: CPU threads of the local worker (0: one per CPU)")
	fl.StringArrayVar(&cfg.QueenArgs, "queen-arg", nil, "ephemeral mode: extra flag for the queen it starts (repeatable)")
	fl.DurationVar(&cfg.StopTimeout, "stop-timeout", keeper.DefaultStopTimeout, "ephemeral mode: how long the queen it started may take to stop; then it is killed")
	fl.BoolVar(&debug, "debug", false, "log what the keeper does on stderr")
	_ = fl.MarkHidden("queen-arg")
	return cmd
}

// runInfer runs the keeper with its own signal handling: it must know
// whether SIGINT (exit 130) or SIGTERM (exit 143) ended it.
func runInfer(cmd *cobra.Command, cfg keeper.InferConfig, debug bool) error {
	cfg.Stdout, cfg.Stderr = cmd.OutOrStdout(), cmd.ErrOrStderr()
	cfg.Tokens = secret.TokensFromEnv()
	if f, ok := cfg.Stderr.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			cfg.Terminal = true
		}
	}
	if debug {
		cfg.Logger = slog.New(slog.NewTextHandler(cfg.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	k, err := keeper.NewInfer(cfg)
	if err != nil {
		return usagef("infer: %w", config.Rename(err, inferFields))
	}

	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigc)
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	got := make(chan os.Signal, 1)
	go func() {
		select {
		case s := <-sigc:
			got <- s
			cancel()
		case <-ctx.Done():
		}
	}()

	err = k.Run(ctx)
	if ctx.Err() != nil {
		cancel()
		var sig os.Signal
		select {
		case sig = <-got:
		case s := <-sigc:
			sig = s
		case <-time.After(time.Second): // main's handler took the signal; call it Ctrl+C
			sig = os.Interrupt
		}
		code := 130
		if sig == syscall.SIGTERM {
			code = 143
		}
		var rest error
		if err != nil && !errors.Is(err, context.Canceled) {
			rest = err
		}
		return &exitError{code: code, err: rest}
	}
	if errors.Is(err, keeper.ErrUsage) {
		return usagef("infer: %w", err)
	}
	return err
}
