package main

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/modelconfig"
	"github.com/apiary-llm/apiary/internal/modelstore"
)

func newModelsPathCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "path [REF]",
		Short: "Print the models directory, or where model REF's file is",
		Long: `Print the models directory (--models-dir, default $XDG_DATA_HOME/apiary/models,
~/.local/share/apiary/models without XDG_DATA_HOME), or the path of model
REF's file there, DIR/REF.gguf, whether it exists or not: what apiary worker
--model takes, and where apiary models testmodel REF writes.`,
		Args: usageArgs(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir, err := modelsDir(dir)
			if err != nil {
				return err
			}
			if len(args) == 0 {
				return printLine(cmd.OutOrStdout(), "%s", dir)
			}
			p, err := modelstore.Path(dir, args[0])
			if err != nil {
				return usagef("models path: %v", err)
			}
			return printLine(cmd.OutOrStdout(), "%s", p)
		},
	}
	cmd.Flags().StringVar(&dir, "models-dir", "", "models directory (default $XDG_DATA_HOME/apiary/models)")
	return cmd
}

// testmodelPath is where `models testmodel ARG` writes: ARG itself when
// it is a path (it holds a "/" or ends in .gguf), else the file of model
// ref ARG in the models directory dir (the default one when "").
func testmodelPath(arg, dir string) (string, error) {
	if strings.ContainsRune(arg, filepath.Separator) || strings.HasSuffix(arg, modelstore.Ext) {
		if dir != "" {
			return "", usagef("models testmodel: --models-dir goes with a REF, not with a path (%s)", arg)
		}
		return arg, nil
	}
	dir, err := modelsDir(dir)
	if err != nil {
		return "", err
	}
	p, err := modelstore.Path(dir, arg)
	if err != nil {
		return "", usagef("models testmodel: %v; give OUT.gguf or a model REF", err)
	}
	return p, nil
}

// namedModel is a line of `models ls --config`: a model file of the
// directory with the name the config gives it, or a configured model
// whose file is not there.
type namedModel struct {
	Name    string   `json:"name,omitempty"` // absent: the config names no model of this file
	Aliases []string `json:"aliases,omitempty"`
	modelstore.Model
	Missing bool `json:"missing,omitempty"` // the config names the model; its file is not in the directory
}

// namedModels pairs the directory's models with the config's names: each
// file once, by the name that serves it, then the configured models
// whose file the directory lacks, by name.
func namedModels(models []modelstore.Model, f *modelconfig.File) []namedModel {
	out := make([]namedModel, 0, len(models))
	have := map[string]bool{}
	for _, m := range models {
		n := namedModel{Model: m}
		if name, cm, ok := f.ByFile(m.Ref); ok {
			n.Name, n.Aliases = name, cm.Aliases
		}
		have[m.Ref] = true
		out = append(out, n)
	}
	for _, name := range f.Names() {
		cm := f.Models[name]
		if !have[cm.File] {
			out = append(out, namedModel{Name: name, Aliases: cm.Aliases, Model: modelstore.Model{Ref: cm.File}, Missing: true})
		}
	}
	return out
}

// listNamedModels is `models ls --config FILE`.
func listNamedModels(cmd *cobra.Command, dir, configPath string, models []modelstore.Model, asJSON bool) error {
	f, err := modelconfig.Load(configPath)
	if err != nil {
		return fmt.Errorf("the model config %s: %w", configPath, err)
	}
	named := namedModels(models, f)
	if asJSON {
		return printJSON(cmd.OutOrStdout(), named)
	}
	t := newTable(cmd.OutOrStdout(), "NAME", "REF", "ARCH", "PARAMS", "SIZE", "CTX", "ALIASES")
	for _, n := range named {
		aliases := orDash(strings.Join(n.Aliases, ", "))
		switch {
		case n.Missing:
			t.row(n.Name, n.Ref, "-", "-", "-", "-", aliases, "no "+n.Ref+modelstore.Ext+" in "+dir)
		case n.Info == nil:
			t.row(orDash(n.Name), n.Ref, "-", "-", api.FormatBytes(uint64(max(n.Size, 0))), "-", aliases, "error: "+n.Error)
		default:
			t.row(orDash(n.Name), n.Ref, orDash(n.Info.Architecture), formatCount(n.Info.ParameterCount), api.FormatBytes(uint64(n.Size)),
				strconv.FormatUint(n.Info.ContextLength, 10), aliases)
		}
	}
	return t.flush()
}
