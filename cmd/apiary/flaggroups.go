package main

import (
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// flagGroup is a heading of a daemon's --help and the flags under it, in
// the order listed.
type flagGroup struct {
	title string
	names []string
}

// flagGroupsKey is the annotation that holds a command's grouped flags.
const flagGroupsKey = "apiary.flag_groups"

// groupFlags has cmd's --help list its flags under groups' headings (as
// kubectl and docker do) instead of one alphabetical list; a flag no group
// names goes under "Other flags", with --help. Call it once every flag is
// added: the list is made then, its defaults redacted as the root's are.
func groupFlags(cmd *cobra.Command, groups []flagGroup) {
	cmd.InitDefaultHelpFlag()
	redactDefaults(cmd)
	fl := cmd.LocalNonPersistentFlags()
	var b strings.Builder
	named := map[string]bool{}
	section := func(title string, names []string) {
		set := pflag.NewFlagSet(title, pflag.ContinueOnError)
		set.SortFlags = false
		for _, n := range names {
			if f := fl.Lookup(n); f != nil {
				set.AddFlag(f)
				named[n] = true
			}
		}
		if set.HasAvailableFlags() {
			b.WriteString("\n" + title + ":\n" + strings.TrimRight(set.FlagUsages(), " \n") + "\n")
		}
	}
	for _, g := range groups {
		section(g.title, g.names)
	}
	var rest []string
	fl.VisitAll(func(f *pflag.Flag) {
		if !named[f.Name] {
			rest = append(rest, f.Name)
		}
	})
	slices.Sort(rest)
	section("Other flags", rest)
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[flagGroupsKey] = b.String()
	const flags = "\n\nFlags:\n{{.LocalFlags.FlagUsages | trimTrailingWhitespaces}}"
	tmpl := cmd.UsageTemplate()
	if strings.Contains(tmpl, flags) {
		cmd.SetUsageTemplate(strings.Replace(tmpl, flags, "\n{{index .Annotations \""+flagGroupsKey+"\" | trimTrailingWhitespaces}}", 1))
	}
}

// ungrouped are the shown flags of cmd that no group names (its --help
// lists them under "Other flags"); --help is always there.
func ungrouped(cmd *cobra.Command, groups []flagGroup) []string {
	named := map[string]bool{}
	for _, g := range groups {
		for _, n := range g.names {
			named[n] = true
		}
	}
	var out []string
	cmd.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
		if !named[f.Name] && f.Name != "help" && !f.Hidden {
			out = append(out, f.Name)
		}
	})
	return out
}
