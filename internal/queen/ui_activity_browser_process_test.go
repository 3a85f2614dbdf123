//go:build !race

package queen

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// The dashboard's activity in a real browser, against a real queen, hive
// and llama.cpp worker: three requests show in the recent requests with
// their model, worker, tokens, time to first token and tok/s; the node
// has a CPU graph; Unload on the loaded model, with a reason typed in
// the dialog, stops its worker (its row STOPPED, saying who unloaded it
// and why; a worker.stop entry by admin in the audit log).
func TestDashboardActivityInBrowser(t *testing.T) {
	c := startCluster(t, nil)
	ctx := t.Context()
	for i := range 3 {
		if _, err := c.client.Completions.New(ctx, completion(8), ignoreEOS); err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
	}
	id := c.rows()[0].ID

	b := newBrowser(t)
	b.run("open the dashboard", chromedp.Navigate(c.url+"/ui/"))
	b.wait("three requests", `#requests tbody tr:nth-child(3)`)
	var rows []map[string]string
	b.eval(`[...document.querySelectorAll('#requests tbody tr')].map(tr => {
		const col = name => tr.querySelector('[data-col="' + name + '"]').textContent;
		return {model: tr.dataset.model, status: tr.dataset.status, worker: tr.cells[2].textContent,
			prompt: col('prompt'), completion: col('completion'), ttft: col('ttft'), tps: col('tps')};
	})`, &rows)
	if len(rows) != 3 {
		t.Fatalf("the recent requests list %d rows, want 3: %v", len(rows), rows)
	}
	for i, r := range rows {
		tps, err := strconv.ParseFloat(r["tps"], 64)
		if r["model"] != "tiny" || r["status"] != "200" || r["worker"] != id || r["completion"] != "8" || r["prompt"] == "" ||
			!strings.HasSuffix(r["ttft"], " ms") || err != nil || tps <= 0 {
			t.Errorf("request row %d: %v; want model tiny, status 200, worker %s, 8 completion tokens, a prompt count, a time to first token and tok/s", i+1, r, id)
		}
	}

	// The route of each (the queen's default --routing prefix), and the
	// model's cache over the listed requests: the same prompt three times
	// to one worker, so its later answers found their prompts cached.
	var routes []string
	b.eval(`[...document.querySelectorAll('#requests tbody tr')].map(tr => tr.dataset.route)`, &routes)
	for i, r := range routes {
		if r != "prefix hit" && r != "prefix miss" {
			t.Errorf("request row %d routed %q; want a prefix route", i+1, r)
		}
	}
	var sum map[string]string
	b.eval(`(() => { const tr = document.querySelector('#cache-summary tr[data-model="tiny"]');
		const col = name => tr.querySelector('[data-col="' + name + '"]').textContent;
		return {requests: col('requests'), cached: col('cached'), title: tr.querySelector('[data-col="cached"]').title, hits: col('hits')} })()`, &sum)
	if n, m, ok := cachedOf(sum["title"]); sum["requests"] != "3" || !ok || n == 0 || n > m || !strings.HasSuffix(sum["cached"], " %") ||
		!strings.Contains(sum["hits"], " of 3 ") {
		t.Errorf("the cache summary of tiny: %v; want 3 requests, some of their prompt tokens cached, the prefix routes' hits of 3", sum)
	}

	// A CPU graph for the node, with a sample in it (the hive sends its
	// load on the beat after the queen asks for it).
	b.wait("the node's CPU graph", `[data-node="node-1"] [data-graph="cpu"]:not([data-points="0"])`)
	b.wait("the node's memory graph", `[data-node="node-1"] [data-graph="mem"]:not([data-points="0"])`)
	b.screenshot("activity")

	// Unload the model from the page.
	const reason = "unloaded from the dashboard test"
	b.run("unload", chromedp.Click(`tr[data-model="tiny"] [data-action="unload"]`, chromedp.ByQuery))
	b.wait("the dialog", "#confirm-reason")
	var prefilled string
	b.eval(`(() => { const el = document.querySelector('#confirm-reason'); const v = el.value; el.value = ''; return v })()`, &prefilled)
	if prefilled == "" {
		t.Error("the Unload dialog has no default reason")
	}
	b.run("the reason", chromedp.SendKeys("#confirm-reason", reason, chromedp.ByQuery), chromedp.Click("#confirm-ok", chromedp.ByQuery),
		chromedp.WaitNotPresent("#confirm-ok", chromedp.ByQuery))
	b.wait("STOPPED", fmt.Sprintf(`tr[data-worker=%q][data-status="STOPPED"]`, id))
	if got := b.text(fmt.Sprintf(`tr[data-worker=%q]`, id)); !strings.Contains(got, "unloaded by admin: "+reason) {
		t.Errorf("the stopped row says %q; want who unloaded it and why", got)
	}
	b.run("no Unload once nothing is loaded", chromedp.WaitNotPresent(`tr[data-model="tiny"] [data-action="unload"]`, chromedp.ByQuery))
	entries, err := c.admin.Audit(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range entries {
		found = found || e.Target == id && e.Action == "worker.stop" && e.Actor == "admin" && e.Reason == reason
	}
	if !found {
		t.Errorf("no worker.stop entry by admin with the page's reason for %s: %+v", id, entries)
	}
	b.checkClean()
}

// cachedOf reads the cache summary's "N of M prompt tokens".
func cachedOf(s string) (n, m int, ok bool) {
	_, err := fmt.Sscanf(s, "%d of %d prompt tokens", &n, &m)
	return n, m, err == nil
}
