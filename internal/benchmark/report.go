package benchmark

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/gguf"
)

// Markers around the section this package owns in docs/benchmarks.md.
const (
	SectionBegin = "<!-- llama-server:begin -->"
	SectionEnd   = "<!-- llama-server:end -->"
)

// Goal is the ratio apiary/llama-server the project aims for, both figures.
const Goal = 0.95

// SideInfo describes one side of the comparison for the report.
type SideInfo struct {
	Name    string
	Version string // what it is built from
	Command string // how it was started
	PeakRSS uint64
}

// ModelInfo describes the benchmark model.
type ModelInfo struct {
	Path string
	Size int64
	Info gguf.Info
}

// ReportInfo is everything the report says besides the measurements.
type ReportInfo struct {
	Date                  time.Time
	Machine               Machine
	LoadBefore, LoadAfter string
	A, B                  SideInfo
	Model                 ModelInfo
	Threads, CtxSize      int
	// Sessions is how many times both servers were started afresh, each
	// for Rounds/Sessions rounds: every process start lays memory out
	// anew, and that alone moves a server's speed by several percent.
	Sessions int
	// BuildInfo is the llama-server build's key=value lines
	// (build-info.txt of scripts/bench-llama-server.sh).
	BuildInfo string
	// LlamaBench is llama-bench's markdown table on the same model, if run.
	LlamaBench string
	Reproduce  string // shell commands
}

// Markdown renders the section, markers included.
func Markdown(ri ReportInfo, res Result) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	gen, pp := res.Generation.Summary(), res.Prompt.Summary()
	promptTokens := 0
	if len(res.Rounds) > 0 {
		promptTokens = res.Rounds[0].Prompt[1].PromptTokens
	}

	p("%s\n## %s vs %s\n\n", SectionBegin, ri.B.Name, ri.A.Name)
	p("Measured %s by `internal/benchmark` (`BenchmarkLlamaServer`, run by `scripts/bench-llama-server.sh`): "+
		"%d rounds counted, in %d sessions (both servers started afresh for each), A/B order alternating, both servers up side by side, same GGUF, %d threads, context %d, "+
		"greedy sampling (temperature 0), ignore_eos, streamed `POST /v1/completions`. "+
		"Goal: ratio %s/%s ≥ %.2f for both figures.\n\n",
		ri.Date.UTC().Format("2006-01-02 15:04 MST"), gen.Rounds, ri.Sessions, ri.Threads, ri.CtxSize, ri.B.Name, ri.A.Name, Goal)

	p("| figure | %s (A) median | %s (B) median | paired ratio B/A: median (min–max) | goal ≥ %.2f |\n", ri.A.Name, ri.B.Name, Goal)
	p("|---|---:|---:|---:|:-:|\n")
	row := func(name string, s Summary) {
		p("| %s | %.1f | %.1f | **%.3f** (%.3f–%.3f) | %s |\n", name, s.MedianA, s.MedianB, s.Ratio, s.RatioMin, s.RatioMax, yesNo(s.Ratio >= Goal))
	}
	row(fmt.Sprintf("generation, tok/s (%d tokens, first chunk → last)", res.Config.GenTokens), gen)
	row(fmt.Sprintf("prompt processing, tok/s (%d-token prompt, max_tokens 1, request → first chunk)", promptTokens), pp)
	p("\n")

	for k, side := range []SideInfo{ri.A, ri.B} {
		g, q := res.ServerGeneration(k), res.ServerPrompt(k)
		if g != nil && q != nil {
			p("- %s's own timings (median): generation %.1f tok/s, prompt %.1f tok/s — the gap to the client's figures is HTTP/streaming overhead.\n",
				side.Name, Median(g), Median(q))
		}
	}
	p("- Greedy outputs identical on both sides in %d of %d rounds.\n", res.SameText, len(res.Rounds))
	p("- Peak resident memory: %s %s, %s %s.\n", ri.A.Name, mib(ri.A.PeakRSS), ri.B.Name, mib(ri.B.PeakRSS))
	p("- Quiet-machine check: a round waits for a quiet second and is run again when other processes (the idle server included) or the hypervisor's steal took more than %.2f CPUs during one of its requests; %d rounds were run again, %d stayed busy when retries ran out (listed below, left out of the medians). Load average before / after: %s / %s.\n\n",
		res.Config.MaxForeign, res.Discarded, res.Disturbed, ri.LoadBefore, ri.LoadAfter)

	p("### Setup\n\n")
	m := ri.Machine
	p("- Machine: %s, %d logical CPUs (%s), %s RAM, %s, kernel %s.\n", m.CPU, m.Cores, m.Flags, gib(m.MemBytes), m.OS, m.Kernel)
	mi := ri.Model.Info
	p("- Model: `%s` (%s), %s %s, %.1f M parameters, %s; embedding %d, %d layers, %d heads (%d KV), feed-forward %d, vocabulary %d, trained context %d.\n",
		filepath.Base(ri.Model.Path), mib(uint64(ri.Model.Size)), mi.Architecture, mi.FileType, float64(mi.ParameterCount)/1e6,
		mi.Name, mi.EmbeddingLength, mi.BlockCount, mi.HeadCount, mi.HeadCountKV, mi.FeedForwardLength, mi.VocabSize, mi.ContextLength)
	p("- A, %s: %s\n  `%s`\n", ri.A.Name, ri.A.Version, ri.A.Command)
	p("- B, %s: %s\n  `%s`\n", ri.B.Name, ri.B.Version, ri.B.Command)
	if ri.BuildInfo != "" {
		p("- llama-server build (from its CMake cache):\n\n```\n%s\n```\n", strings.TrimSpace(ri.BuildInfo))
	}
	p("\n### Per round (tok/s)\n\n")
	p("| round | first | gen A | gen B | B/A | prompt A | prompt B | B/A | others' CPUs |\n|---:|:-:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, rd := range res.Rounds {
		first := "A"
		if !rd.AFirst {
			first = "B"
		}
		busy := ""
		if rd.Busy {
			busy = " (busy: not counted)"
		}
		ga, gb := rd.Generation[0].GenerationRate(), rd.Generation[1].GenerationRate()
		pa, pb := rd.Prompt[0].PromptRate(), rd.Prompt[1].PromptRate()
		p("| %d | %s | %.1f | %.1f | %.3f | %.1f | %.1f | %.3f | %.2f%s |\n", i+1, first, ga, gb, ratio(gb, ga), pa, pb, ratio(pb, pa), rd.Foreign, busy)
	}
	if ri.LlamaBench != "" {
		p("\n### llama-bench on the same model (reference: no HTTP, no sampling)\n\n%s\n", strings.TrimSpace(ri.LlamaBench))
	}
	if ri.Reproduce != "" {
		p("\n### Reproduce\n\n```sh\n%s\n```\n", strings.TrimSpace(ri.Reproduce))
	}
	p("%s\n", SectionEnd)
	return b.String()
}

func ratio(b, a float64) float64 {
	if a == 0 {
		return 0
	}
	return b / a
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

func mib(n uint64) string { return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20)) }
func gib(n uint64) string { return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30)) }

// ReplaceSection returns doc with the part from SectionBegin to SectionEnd
// replaced by section, which carries its own markers. A doc without the
// markers gets section appended; an empty doc gets a title first.
func ReplaceSection(doc, section string) string {
	section = strings.TrimRight(section, "\n") + "\n"
	if i := strings.Index(doc, SectionBegin); i >= 0 {
		if j := strings.Index(doc[i:], SectionEnd); j >= 0 {
			end := i + j + len(SectionEnd)
			rest := strings.TrimPrefix(doc[end:], "\n")
			return doc[:i] + section + rest
		}
	}
	if strings.TrimSpace(doc) == "" {
		return "# Benchmarks\n\n" + section
	}
	return strings.TrimRight(doc, "\n") + "\n\n" + section
}

// UpdateFile replaces the section in the file at path, creating the file
// (and its directory) if missing. Other sections are kept as they are.
func UpdateFile(path, section string) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(ReplaceSection(string(old), section)), 0o644)
}
