package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/gguf"
	"github.com/apiary-llm/apiary/internal/modelstore"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

func newModelsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "models",
		Short: "List, pull and generate models; keep workers of a model warm",
		Long: `List, pull and generate GGUF models. A model's ref is its file name in the
models directory without ".gguf" (DIR/tiny.gguf is "tiny"). The models
directory defaults to $XDG_DATA_HOME/apiary/models (~/.local/share/apiary/models).
path prints where a model's file goes. scale sets, through the queen, how
many workers of a model stay live.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown command %q for %q (want ls, path, pull, testmodel or scale)", args[0], cmd.CommandPath())
			}
			return usagef("%s: missing command (ls, path, pull, testmodel or scale)", cmd.CommandPath())
		},
	}
	cmd.AddCommand(newModelsLsCmd(), newModelsPathCmd(), newModelsPullCmd(), newModelsTestmodelCmd(), newModelsScaleCmd())
	return cmd
}

func newModelsLsCmd() *cobra.Command {
	var dir, configPath string
	var asJSON, all bool
	pf := &poolFlags{}
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the models of the models directory",
		Long: `List the *.gguf files of the models directory with what their headers say.
A file that cannot be read (not a GGUF, truncated, a split model that lacks a
part) is listed with the reason; a download under way (*.partial) is not
listed. With --config FILE (the queen's model config), each file's NAME is
the name the config gives it, and a configured model whose file is not
there is listed too. With --all, list instead the models of every pool as
the queen reads them from their hives (which leave out the files they
cannot read), each with the name the queen's config gives it; uses
$APIARY_ADMIN_TOKEN.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if all {
				if cmd.Flags().Changed("models-dir") || configPath != "" {
					return usagef("models ls: --models-dir and --config do not go with --all (the queen has its own config)")
				}
				c, err := pf.client()
				if err != nil {
					return err
				}
				pools, err := c.PoolModels(cmd.Context())
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), api.PoolModelsList{Pools: pools})
				}
				return printPoolModels(cmd.OutOrStdout(), pools)
			}
			dir, err := modelsDir(dir)
			if err != nil {
				return err
			}
			models, err := modelstore.List(dir)
			if err != nil {
				return err
			}
			if configPath != "" {
				return listNamedModels(cmd, dir, configPath, models, asJSON)
			}
			if asJSON {
				if models == nil {
					models = []modelstore.Model{}
				}
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(models)
			}
			if len(models) == 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "no models in %s (add one with `apiary models pull hf://ORG/REPO:QUANT` or `apiary models testmodel %s`)\n",
					dir, modelPathHint(dir))
			}
			return printModels(cmd.OutOrStdout(), models)
		},
	}
	cmd.Flags().StringVar(&dir, "models-dir", "", "models directory (default $XDG_DATA_HOME/apiary/models)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	cmd.Flags().BoolVar(&all, "all", false, "list the models of every pool, through the queen")
	cmd.Flags().StringVar(&configPath, "config", "", "the queen's model config (YAML): show the name it gives each file")
	pf.register(cmd)
	return cmd
}

// printModels writes the table of `apiary models ls`.
func printModels(w io.Writer, models []modelstore.Model) error {
	t := newTable(w, "REF", "ARCH", "PARAMS", "SIZE", "CTX")
	for _, m := range models {
		size := "-"
		if m.Size > 0 || m.Error == "" {
			size = api.FormatBytes(uint64(m.Size))
		}
		if m.Info == nil {
			t.row(m.Ref, "-", "-", size, "-", "error: "+m.Error)
			continue
		}
		t.row(m.Ref, orDash(m.Info.Architecture), formatCount(m.Info.ParameterCount), size, strconv.FormatUint(m.Info.ContextLength, 10))
	}
	return t.flush()
}

func newModelsPullCmd() *cobra.Command {
	var dir, name, pool, reason string
	var force, detach, status bool
	var stall time.Duration
	pf := &poolFlags{}
	cmd := &cobra.Command{
		Use:   "pull REF | pull --pool POOL --status",
		Short: "Download a GGUF model from Hugging Face or a URL into the models directory",
		Long: `Download a GGUF model into the models directory. REF is
  hf://ORG/REPO:QUANT      the repository's GGUF whose file name holds QUANT (any case)
  hf://ORG/REPO/FILE.gguf  that file of the repository
  hf.co/ORG/REPO:QUANT     the same, as Ollama writes it
  https://HOST/PATH.gguf   any URL
A split model (NAME-00001-of-00003.gguf …) is fetched whole. The model is
saved as REF.gguf, REF being --name or the file name without ".gguf" (a
split model's parts as NAME-0000i-of-0000N.gguf; its ref is the first's).

Each file is written to FILE.gguf.partial: a broken connection is resumed
where it stopped, and so is one that sends nothing for --stall-timeout
while it stays open, and a pull run again after a failure or Ctrl-C.
The sha256 the Hub publishes is checked, the GGUF header read, and the free
disk space checked first; only then does the file take its name. The Hub is
$HF_ENDPOINT (default https://huggingface.co); $HF_TOKEN is sent for gated
and private repositories.

With --pool, the queen asks that pool's hive to pull REF into its own models
directory (with the hive's HF_ENDPOINT and HF_TOKEN), and this command
follows the pull until it ends (--detach: returns at once); the queen's
audit log records model.pull_started, model.pulled or model.pull_failed.
--pool POOL --status lists the pulls that hive remembers. Uses
$APIARY_ADMIN_TOKEN.`,
		Args: usageArgs(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			fl := cmd.Flags()
			if pool == "" && (fl.Changed("reason") || detach || status) {
				return usagef("models pull: --reason, --detach and --status go with --pool")
			}
			if pool != "" {
				if fl.Changed("models-dir") {
					return usagef("models pull: %v", errPoolFlags)
				}
				if fl.Changed("stall-timeout") {
					return usagef("models pull: --stall-timeout does not go with --pool: the pool's hive has its own (apiary hive --pull-stall-timeout)")
				}
				c, err := pf.client()
				if err != nil {
					return err
				}
				if status {
					if len(args) > 0 {
						return usagef("models pull --status takes no REF")
					}
					pulls, err := c.ModelPulls(cmd.Context(), pool)
					if err != nil {
						return err
					}
					return printPulls(cmd.OutOrStdout(), pulls)
				}
				if len(args) == 0 {
					return usagef("models pull: missing REF")
				}
				return pullOnPool(cmd.Context(), c, pool, api.PullModelRequest{Ref: args[0], Name: name, Force: force, Reason: reason},
					detach, cmd.OutOrStdout(), cmd.ErrOrStderr())
			}
			if len(args) == 0 {
				return usagef("models pull: missing REF")
			}
			if stall <= 0 {
				return usagef("models pull: --stall-timeout must be positive, got %s", stall)
			}
			dir, err := modelsDir(dir)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return fmt.Errorf("models directory: %w", err)
			}
			hub := modelstore.HubFromEnv()
			src, err := modelstore.ResolveSource(cmd.Context(), nil, hub, args[0])
			if err != nil {
				return pullError(cmd, err, name)
			}
			label := name
			if label == "" {
				label = src.Name
			}
			p := newProgress(cmd.ErrOrStderr(), label)
			m, err := modelstore.Pull(cmd.Context(), dir, args[0], modelstore.PullOptions{
				Ref: name, Overwrite: force, Hub: hub, Source: &src, Progress: p.report, StallTimeout: stall, Retrying: p.retry,
			})
			if err != nil {
				return pullError(cmd, err, name)
			}
			p.done()
			return printLine(cmd.OutOrStdout(), "pulled %s: %s", m.Ref, describeModel(m.Path, m.Info, m.Size))
		},
	}
	cmd.Flags().StringVar(&dir, "models-dir", "", "models directory (default $XDG_DATA_HOME/apiary/models)")
	cmd.Flags().StringVar(&name, "name", "", "ref of the model (default: the file name without .gguf)")
	cmd.Flags().BoolVar(&force, "force", false, "replace a model of the same ref")
	cmd.Flags().StringVar(&pool, "pool", "", "have this pool's hive pull the model, through the queen")
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the queen's audit log (with --pool)")
	cmd.Flags().BoolVar(&detach, "detach", false, "with --pool: return once the pull started")
	cmd.Flags().BoolVar(&status, "status", false, "with --pool: list the pulls of the pool's hive")
	cmd.Flags().DurationVar(&stall, "stall-timeout", modelstore.DefaultStallTimeout,
		"a connection that sends no byte for this long is dropped and the download resumed from where it was")
	pf.register(cmd)
	return cmd
}

// pullError maps a pull's error to the CLI's: usage errors, hints, and
// 130 for an interrupted pull.
func pullError(cmd *cobra.Command, err error, name string) error {
	switch {
	case errors.Is(err, modelstore.ErrBadRef) && name != "":
		return usagef("--name: %v", err)
	case errors.Is(err, modelstore.ErrBadRef):
		return usagef("%v; pass --name", err)
	case errors.Is(err, modelstore.ErrBadURL):
		return usagef("%v", err)
	case errors.Is(err, modelstore.ErrExists):
		return fmt.Errorf("%w; pass --force to replace it", err)
	case cmd.Context().Err() != nil:
		return &exitError{code: 130, err: errors.New("pull interrupted; run it again to resume")}
	}
	return err
}

// progress prints a pull's progress: bytes, rate and time left. On a
// terminal one line is rewritten (\r) at most every 200ms; elsewhere a
// plain line is printed every 10 seconds. done prints the last line.
type progress struct {
	w     io.Writer
	label string
	tty   bool
	now   func() time.Time

	start, last time.Time
	base        int64 // bytes resumed, not counted in the rate
	cur         modelstore.Progress
}

func newProgress(w io.Writer, label string) *progress {
	return &progress{w: w, label: label, tty: isTerminal(w), now: time.Now}
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func (p *progress) report(pr modelstore.Progress) {
	now := p.now()
	if p.start.IsZero() {
		p.start, p.base, p.last = now, pr.Resumed, now
		if pr.Resumed > 0 {
			fmt.Fprintf(p.w, "pull %s: resuming after %s\n", p.label, api.FormatBytes(uint64(pr.Resumed)))
		}
	}
	p.cur = pr
	every := 10 * time.Second
	if p.tty {
		every = 200 * time.Millisecond
	}
	if now.Sub(p.last) >= every {
		p.last = now
		p.print(now, false)
	}
}

// retry says, on a line of its own, why the download is tried again and
// from where ("pull tiny: no bytes for 60s; resuming at 41943040 bytes").
func (p *progress) retry(r modelstore.Retry) {
	if p.tty && !p.start.IsZero() {
		fmt.Fprint(p.w, "\r\033[K") // the progress line is drawn again after it
	}
	fmt.Fprintf(p.w, "pull %s: %s\n", p.label, r)
}

// done prints the final line, once something was reported.
func (p *progress) done() {
	if !p.start.IsZero() {
		p.print(p.now(), true)
	}
}

func (p *progress) print(now time.Time, final bool) {
	pr := p.cur
	line := fmt.Sprintf("pull %s: %s", p.label, api.FormatBytes(uint64(pr.Written)))
	if pr.Total > 0 {
		line += fmt.Sprintf(" of %s (%d%%)", api.FormatBytes(uint64(pr.Total)), pr.Written*100/pr.Total)
	}
	if el := now.Sub(p.start); el > 0 && pr.Written > p.base {
		rate := float64(pr.Written-p.base) / el.Seconds()
		line += fmt.Sprintf(", %s/s", api.FormatBytes(uint64(rate)))
		if pr.Total > 0 && !final {
			line += fmt.Sprintf(", %s left", time.Duration(float64(pr.Total-pr.Written)/rate*float64(time.Second)).Round(time.Second))
		}
	}
	switch {
	case p.tty && final:
		fmt.Fprintf(p.w, "\r%s\033[K\n", line)
	case p.tty:
		fmt.Fprintf(p.w, "\r%s\033[K", line)
	default:
		fmt.Fprintln(p.w, line)
	}
}

func newModelsTestmodelCmd() *cobra.Command {
	var opts testmodel.Options
	var proj testmodel.ProjectorOptions
	var arch, dir, mmproj string
	var force bool
	cmd := &cobra.Command{
		Use:   "testmodel [--arch ARCH] [--rerank] [--mmproj PROJ.gguf] OUT.gguf | REF",
		Short: "Write a small deterministic model with random weights",
		Long: `Write a small GGUF model with random weights to OUT.gguf, or, given a model
REF (no "/", no ".gguf"), to REF.gguf in the models directory (--models-dir,
default $XDG_DATA_HOME/apiary/models; apiary models path REF prints it), of
architecture
--arch (default llama): ` + testmodel.ArchNames() + `.
Each has the metadata and tensors llama.cpp's loader of that architecture
requires, and its family's specifics (Qwen2's Q/K/V biases, Qwen3's Q/K
norms, Qwen3-MoE's experts, Qwen 3.5's linear-attention layers, Gemma's
sliding-window layers, Phi-3's fused projections, Ministral 3's YaRN
scaling). llama.cpp loads and runs it, which makes it a stand-in for a
real model in tests and demos. Every architecture has the same
SentencePiece vocabulary: one token a printable ASCII character, byte
tokens for the rest, and (--text, the default) words, which are all the
model writes: random words, but text. --text=false writes the byte-level
model the tests use, whose answers are mostly bytes that are no text
(shown as U+FFFD). --rerank writes a reranker instead, as llama.cpp knows
Qwen3-Reranker: a qwen3 model whose metadata names rank pooling, with a
two-label classifier head (cls.output.weight) and a rerank template; a
worker of it answers POST /v1/rerank with scores in 0…1, arbitrary but
the same every time. The same options always give the same file.

--mmproj PROJ.gguf also writes a vision projector for the model (random
weights too): a small ViT and LLaVA's MLP projector, which llama.cpp's
libmtmd loads beside the model; an image becomes (image-size/patch-size)²
positions of the model's context. The worker pairs M.gguf with
mmproj-M.gguf in the same directory, so --mmproj DIR/mmproj-M.gguf makes
M see.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Arch = testmodel.Arch(arch)
			if opts.Rerank && !cmd.Flags().Changed("arch") {
				opts.Arch = testmodel.Qwen3
			}
			if err := opts.Validate(); err != nil {
				return usagef("%v", err)
			}
			proj.TextDim = cmp.Or(opts.Dim, 64)
			if mmproj != "" {
				if err := proj.Validate(); err != nil {
					return usagef("%v", err)
				}
			}
			out, err := testmodelPath(args[0], dir)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
				return err
			}
			f, err := modelstore.WriteFile(out, force, func(w io.Writer) error { return testmodel.Write(w, opts) })
			if errors.Is(err, modelstore.ErrExists) {
				return fmt.Errorf("%w; pass --force to replace it", err)
			}
			if err != nil {
				return err
			}
			info := f.Info()
			if err := printLine(cmd.OutOrStdout(), "wrote %s", describeModel(out, &info, f.Size)); err != nil || mmproj == "" {
				return err
			}
			if _, err := modelstore.WriteFile(mmproj, force, func(w io.Writer) error { return testmodel.WriteProjector(w, proj) }); err != nil {
				if errors.Is(err, modelstore.ErrExists) {
					return fmt.Errorf("%w; pass --force to replace it", err)
				}
				return err
			}
			return printLine(cmd.OutOrStdout(), "wrote %s (vision projector, %d positions an image)", mmproj, proj.ImageTokens())
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&mmproj, "mmproj", "", "also write a vision projector for the model to this path (name it mmproj-M.gguf beside M.gguf)")
	fl.IntVar(&proj.ImageSize, "image-size", testmodel.ProjectorImageSize, "with --mmproj: side of the square image the projector sees, a multiple of --patch-size")
	fl.IntVar(&proj.PatchSize, "patch-size", testmodel.ProjectorPatchSize, "with --mmproj: side of a patch (one position of the context)")
	fl.StringVar(&arch, "arch", string(testmodel.Llama), "architecture: "+testmodel.ArchNames())
	fl.Int64Var(&opts.Seed, "seed", 1, "seed of the random weights (0 means 1)")
	fl.IntVar(&opts.Layers, "layers", 2, fmt.Sprintf("transformer blocks, 1 to %d", testmodel.MaxLayers))
	fl.IntVar(&opts.Dim, "dim", 64, fmt.Sprintf("embedding length from %d to %d, a multiple of 2 × heads", testmodel.MinDim, testmodel.MaxDim))
	fl.IntVar(&opts.Heads, "heads", testmodel.Heads, fmt.Sprintf("attention heads, 1 to %d", testmodel.MaxHeads))
	fl.IntVar(&opts.KVHeads, "kv-heads", 0, "K and V heads, a divisor of heads; 0: heads for llama, heads/2 (when even) for the others")
	fl.IntVar(&opts.FF, "ff", 0, fmt.Sprintf("feed-forward length, 1 to %d; 0: %d × dim (each expert of a MoE: ff / experts-used)", testmodel.MaxFF, testmodel.FeedForwardFactor))
	fl.IntVar(&opts.Experts, "experts", 0, fmt.Sprintf("experts of each layer of a MoE architecture (%s), 2 to %d; 0: %d", testmodel.Qwen3MoE, testmodel.MaxExperts, testmodel.DefaultExperts))
	fl.IntVar(&opts.ExpertsUsed, "experts-used", 0, fmt.Sprintf("experts each token uses, 1 to experts; 0: %d", testmodel.DefaultExpertsUsed))
	fl.IntVar(&opts.Vocab, "vocab", 0, fmt.Sprintf("tokens, %d (bytes, printable characters and words; %d without --text) to %d (and pairs of characters); 0: the least",
		testmodel.TextVocabSize, testmodel.VocabSize, testmodel.MaxVocab+testmodel.TextVocabSize-testmodel.VocabSize))
	fl.BoolVar(&opts.Text, "text", true, "words in the vocabulary and weights that write only those (--text=false: the byte-level model of the tests)")
	fl.BoolVar(&opts.ToolTemplate, "tool-template", false, "give the model a ChatML chat template with Hermes-style tool calling")
	fl.BoolVar(&opts.Rerank, "rerank", false, "write a reranker (architecture "+string(testmodel.Qwen3)+", rank pooling, a classifier head) for POST /v1/rerank")
	fl.BoolVar(&force, "force", false, "replace an existing file")
	fl.StringVar(&dir, "models-dir", "", "models directory a REF is written to (default $XDG_DATA_HOME/apiary/models)")
	return cmd
}

func newModelsScaleCmd() *cobra.Command {
	a := &adminFlags{}
	var minW, maxW int
	var reason string
	cmd := &cobra.Command{
		Use:   "scale [MODEL --min N [--max M] --reason TEXT]",
		Short: "Keep at least N workers of a model live; without MODEL, list the settings",
		Long: `Set how many workers of MODEL the queen keeps live: at least --min, placed as
demand places them (kind replica) with no request waiting, and replaced when
one fails or is lost; at most --max (default: the queen's --max-workers or
--model-max-workers). The setting is stored and survives queen restarts;
--min 0 keeps none warm. A model whose workers keep failing is in a crash
loop: it is then replaced only at a slow pace (the queen's
--crashloop-backoff) until one of its workers serves. Without MODEL, lists
every setting with its live workers and crash loop. Uses $APIARY_ADMIN_TOKEN.`,
		Args: usageArgs(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			fl := cmd.Flags()
			if len(args) == 0 {
				if fl.Changed("min") || fl.Changed("max") || fl.Changed("reason") {
					return usagef("models scale: --min, --max and --reason need a MODEL")
				}
				settings, err := a.client().ModelSettings(cmd.Context())
				if err != nil {
					return err
				}
				if a.asJSON {
					return printJSON(cmd.OutOrStdout(), api.ModelSettingList{Models: settings})
				}
				return printModelSettings(cmd.OutOrStdout(), settings, time.Now())
			}
			if !fl.Changed("min") {
				return usagef("models scale: --min is required")
			}
			if strings.TrimSpace(reason) == "" {
				return usagef("models scale: --reason is required (it goes to the audit log)")
			}
			if minW < 0 {
				return usagef("models scale: --min must not be negative, got %d", minW)
			}
			var m *int
			if fl.Changed("max") {
				if maxW < minW {
					return usagef("models scale: --max %d is below --min %d", maxW, minW)
				}
				m = &maxW
			}
			set, err := a.client().ScaleModel(cmd.Context(), args[0], minW, m, reason)
			if err != nil {
				return err
			}
			if a.asJSON {
				return printJSON(cmd.OutOrStdout(), set)
			}
			return printModelSettings(cmd.OutOrStdout(), []api.ModelSetting{set}, time.Now())
		},
	}
	cmd.Flags().IntVar(&minW, "min", 0, "workers of the model kept live at least (required with MODEL)")
	cmd.Flags().IntVar(&maxW, "max", 0, "workers of the model at most (default: the queen's --max-workers)")
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit log (required with MODEL)")
	a.register(cmd)
	return cmd
}

// printModelSettings writes the table of `apiary models scale`.
func printModelSettings(w io.Writer, settings []api.ModelSetting, now time.Time) error {
	t := newTable(w, "MODEL", "MIN", "MAX", "STARTING", "RUNNING", "STATE", "REASON")
	for _, s := range settings {
		maxW := "-"
		if s.MaxWorkers != nil {
			maxW = strconv.Itoa(*s.MaxWorkers)
		}
		state := "ok"
		if l := s.CrashLoop; l != nil {
			state = fmt.Sprintf("crash loop for %s (%d failures; next try in %s): %s", age(now, l.Since), l.Failures,
				max(l.NextTry.Sub(now), 0).Round(time.Second), oneLine(l.LastFailure, 80))
		} else if s.Starting+s.Running < s.MinWorkers {
			state = "below min"
		}
		t.row(modelShown(s.ModelName, s.Model), strconv.Itoa(s.MinWorkers), maxW, strconv.Itoa(s.Starting), strconv.Itoa(s.Running), state, oneLine(s.Reason, 60))
	}
	return t.flush()
}

// modelsDir returns dir, or the default models directory when it is empty.
func modelsDir(dir string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	d, err := modelstore.DefaultDir()
	if err != nil {
		return "", usagef("%v; pass --models-dir", err)
	}
	return d, nil
}

func modelPathHint(dir string) string {
	p, _ := modelstore.Path(dir, "tiny")
	return p
}

// describeModel is the one-line summary pull and testmodel print.
func describeModel(path string, info *gguf.Info, size int64) string {
	return fmt.Sprintf("%s (%s, %s params, %s, context %d)",
		path, orDash(info.Architecture), formatCount(info.ParameterCount), api.FormatBytes(uint64(size)), info.ContextLength)
}

// usageArgs makes cobra's argument checks usage errors (exit code 2).
func usageArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return usagef("%s: %v", cmd.CommandPath(), err)
		}
		return nil
	}
}

// formatCount formats a parameter count the way model cards do: 176.7K,
// 494.0M, 7.2B.
func formatCount(n uint64) string {
	switch {
	case n >= 1e12:
		return fmt.Sprintf("%.1fT", float64(n)/1e12)
	case n >= 1e9:
		return fmt.Sprintf("%.1fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fK", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
