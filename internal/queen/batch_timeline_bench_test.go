package queen

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// timelineEnv, when set, runs BenchmarkBatchInteractiveTTFT with the
// queen and the worker at Debug and reports where an interactive
// request's time went, from their timelines ("relay timeline",
// "generation timeline", "sequence timeline", "batch request
// preempted"). Debug logging costs the processes CPU: the TTFT figures
// of such a run are not the benchmark's.
const timelineEnv = "APIARY_BENCH_TIMELINE"

// window is when the client sent interactive requests, and whether the
// batch was running then.
type window struct {
	from, to time.Time
	busy     bool
	tokens   int // the batch requests' max_tokens
}

// logRec is a parsed JSON log line.
type logRec map[string]any

func (r logRec) time(k string) time.Time {
	s, _ := r[k].(string)
	t, _ := time.Parse(time.RFC3339Nano, s)
	return t
}

func (r logRec) us(k string) (float64, bool) {
	v, ok := r[k].(float64)
	return v, ok && v >= 0
}

func parseLogs(text string) []logRec {
	var out []logRec
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexByte(line, '{'); i >= 0 {
			var r logRec
			if json.Unmarshal([]byte(line[i:]), &r) == nil {
				out = append(out, r)
			}
		}
	}
	return out
}

// reportTimeline prints the medians of each part of the interactive
// requests' time, idle and busy, from the queen's logs and the worker
// logs under dir.
func reportTimeline(b *testing.B, queenLogs, dir string, wins []window) {
	files, _ := filepath.Glob(filepath.Join(dir, "hive", "hive", "logs", "*.log"))
	var wtext strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			b.Fatal(err)
		}
		wtext.Write(data)
	}
	q, w := parseLogs(queenLogs), parseLogs(wtext.String())
	var group window
	in := func(t time.Time, busy bool) bool {
		return slices.ContainsFunc(wins, func(x window) bool {
			return x.busy == busy && (!busy || x.tokens == group.tokens) && !t.Before(x.from) && t.Before(x.to)
		})
	}
	// The interactive requests' prompt length, to tell their sequences
	// from the batch's: the first one's, sent before any batch.
	promptTokens := -1.0
	for _, r := range w {
		if r["msg"] == "sequence timeline" && !r.time("submitted").Before(wins[0].from) {
			promptTokens, _ = r["prompt_tokens"].(float64)
			break
		}
	}
	at := func(t time.Time, us float64) time.Time { return t.Add(time.Duration(us) * time.Microsecond) }
	for _, group = range []window{{}, {busy: true, tokens: 8}, {busy: true, tokens: 64}} {
		busy := group.busy
		parts := map[string][]float64{}
		add := func(k string, v float64) { parts[k] = append(parts[k], v) }
		var reused, conns int
		var relays, gens, seqs []logRec
		for _, r := range q {
			if r["msg"] == "relay timeline" && r["path"] == "/v1/completions" && in(r.time("start"), busy) {
				relays = append(relays, r)
			}
		}
		for _, r := range w {
			switch {
			case r["msg"] == "generation timeline" && r["endpoint"] == "completions" && in(r.time("start"), busy):
				gens = append(gens, r)
			case r["msg"] == "sequence timeline" && in(r.time("submitted"), busy) && r["prompt_tokens"] == promptTokens:
				seqs = append(seqs, r)
			case r["msg"] == "generation timeline" && r["endpoint"] != "completions" && in(r.time("start"), busy):
				if v, ok := r.us("gone_to_freed_us"); ok {
					add("batch: client gone → worker slot freed", v)
				}
			}
		}
		for _, r := range w {
			if v, ok := r.us("cancel_noticed_us"); ok && r["msg"] == "sequence timeline" && in(r.time("submitted"), busy) {
				add("batch: ctx cancelled → engine drops the sequence", v)
			}
		}
		for _, r := range relays {
			start := r.time("start")
			for _, k := range []string{"grant_us", "conn_us", "sent_us", "headers_us", "first_event_us"} {
				if v, ok := r.us(k); ok {
					add("queen: arrival → "+strings.TrimSuffix(k, "_us"), v)
				}
			}
			conns++
			if r["conn_reused"] == true {
				reused++
			}
			// The worker's generation that began after the queen's arrival
			// and before its first event; the engine's sequence within it.
			first, _ := r.us("first_event_us")
			end := start.Add(time.Duration(first) * time.Microsecond)
			for _, g := range gens {
				gs := g.time("start")
				if gs.Before(start) || gs.After(end) {
					continue
				}
				add("worker: handler start (from queen arrival)", float64(gs.Sub(start).Microseconds()))
				if v, ok := g["arrived_us"].(float64); ok {
					add("worker: arrival (from queen arrival)", float64(at(gs, v).Sub(start).Microseconds()))
				}
				if v, ok := g.us("first_event_tokens"); ok {
					add("worker: tokens in the first event (count, not µs)", v)
				}
				if v, ok := g.us("admit_us"); ok {
					add("worker: handler start → slot (admit)", v)
				}
				wfirst, ok := g.us("first_event_us")
				if ok {
					add("worker: handler start → first event written", wfirst)
					add("queen: worker's first event written → relayed", float64(end.Sub(at(gs, wfirst)).Microseconds()))
				}
				for _, s := range seqs {
					ss := s.time("submitted")
					if ss.Before(gs) || ss.After(end) {
						continue
					}
					add("engine: submitted (from handler start)", float64(ss.Sub(gs).Microseconds()))
					if v, ok := s.us("take_wait_us"); ok {
						add("engine: submitted → taken by the loop", v)
					}
					wait, _ := s.us("take_wait_us")
					if v, ok := s.us("first_token_us"); ok {
						add("engine: taken → first token sampled", v)
						if wfirst > 0 {
							add("worker: first token sampled → its event written", float64(at(gs, wfirst).Sub(at(ss, wait+v)).Microseconds()))
						}
					}
					if v, ok := s.us("first_step_us"); ok {
						add("engine: the decode step of the first token", v)
					}
					break
				}
				break
			}
		}
		keys := make([]string, 0, len(parts))
		for k := range parts {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		var sb strings.Builder
		fmt.Fprintf(&sb, "timeline, busy=%v (batch of %d-token requests): %d relays, connection reused %d of %d\n", busy, group.tokens, len(relays), reused, conns)
		for _, k := range keys {
			v := slices.Clone(parts[k])
			slices.Sort(v)
			fmt.Fprintf(&sb, "  %-55s n=%4d p50 %7.0f µs  p90 %7.0f µs\n", k, len(v), v[len(v)/2], v[len(v)*9/10])
		}
		b.Log("\n" + sb.String())
	}
}
