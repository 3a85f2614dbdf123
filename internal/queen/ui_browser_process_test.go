//go:build !race

package queen

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/dashboard"
)

// browser is a headless Chromium driven through the DevTools protocol,
// with the page's console errors and uncaught exceptions kept (a CSP
// violation is a console error).
type browser struct {
	t   *testing.T
	ctx context.Context

	mu       sync.Mutex
	problems []string // guarded by mu
}

// newBrowser starts Debian's chromium, headless and without its sandbox
// (CI runs as root), at a desktop size.
func newBrowser(t *testing.T) *browser {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("the dashboard's browser tests need Debian's chromium (scripts/deps.sh installs it): %v", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1280, 900))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	// The pinned protocol types are older than Debian's chromium: events
	// with values they do not know are dropped, which the tests do not
	// need; other errors are the test's.
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithErrorf(func(format string, args ...any) {
		if msg := fmt.Sprintf(format, args...); !strings.Contains(msg, "could not unmarshal event") {
			t.Logf("chromedp: %s", msg)
		}
	}))
	b := &browser{t: t, ctx: ctx}
	t.Cleanup(func() {
		_ = chromedp.Cancel(ctx)
		cancel()
		cancelAlloc()
	})
	chromedp.ListenTarget(ctx, func(ev any) {
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			b.problem("exception: " + ev.ExceptionDetails.Error())
		case *log.EventEntryAdded:
			if ev.Entry.Level == log.LevelError && !strings.Contains(ev.Entry.Text, "401") {
				b.problem("console: " + ev.Entry.Text)
			}
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.APITypeError {
				b.problem("console.error")
			}
		}
	})
	if err := chromedp.Run(ctx, log.Enable(), runtime.Enable()); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return b
}

func (b *browser) problem(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.problems = append(b.problems, s)
}

// checkClean fails the test on any console error or exception so far.
func (b *browser) checkClean() {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.problems) > 0 {
		b.t.Errorf("the page reported problems:\n%s", strings.Join(b.problems, "\n"))
	}
}

// run runs actions within waitLimit.
func (b *browser) run(what string, actions ...chromedp.Action) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, waitLimit)
	defer cancel()
	if err := chromedp.Run(ctx, actions...); err != nil {
		var html string
		hctx, hcancel := context.WithTimeout(b.ctx, 5*time.Second)
		_ = chromedp.Run(hctx, chromedp.OuterHTML("main", &html, chromedp.ByQuery))
		hcancel()
		b.t.Fatalf("%s: %v\nthe page's main:\n%s", what, err, html)
	}
}

// wait waits until sel matches a visible element.
func (b *browser) wait(what, sel string) {
	b.t.Helper()
	b.run(what, chromedp.WaitVisible(sel, chromedp.ByQuery))
}

// text is the text of the first element sel matches.
func (b *browser) text(sel string) string {
	b.t.Helper()
	var s string
	b.run("text of "+sel, chromedp.Text(sel, &s, chromedp.ByQuery))
	return s
}

// waitText waits until the text of sel satisfies ok.
func (b *browser) waitText(what, sel string, ok func(string) bool) string {
	b.t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		var s string
		ctx, cancel := context.WithTimeout(b.ctx, waitLimit)
		err := chromedp.Run(ctx, chromedp.Text(sel, &s, chromedp.ByQuery))
		cancel()
		if err == nil && ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("%s: not within %s; text of %s: %q (%v)", what, waitLimit, sel, s, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// eval evaluates a JavaScript expression into out.
func (b *browser) eval(expr string, out any) {
	b.t.Helper()
	b.run("evaluate "+expr, chromedp.Evaluate(expr, out))
}

// confirm fills the page's confirmation with reason and confirms.
func (b *browser) confirm(reason string) {
	b.t.Helper()
	b.run("confirm", chromedp.WaitVisible("#confirm-reason", chromedp.ByQuery),
		chromedp.SendKeys("#confirm-reason", reason, chromedp.ByQuery), chromedp.Click("#confirm-ok", chromedp.ByQuery),
		chromedp.WaitNotPresent("#confirm-ok", chromedp.ByQuery))
}

// screenshot saves the viewport as NAME.png under $APIARY_UI_SCREENSHOTS
// (docs/ui when making the documentation's), else under the test's
// temporary directory, and checks that it is a PNG.
func (b *browser) screenshot(name string) {
	b.t.Helper()
	var png []byte
	b.run("screenshot "+name, chromedp.Sleep(0), chromedp.CaptureScreenshot(&png))
	if len(png) < 8 || string(png[1:4]) != "PNG" {
		b.t.Fatalf("screenshot %s is not a PNG (%d bytes)", name, len(png))
	}
	dir := os.Getenv("APIARY_UI_SCREENSHOTS")
	if dir == "" {
		dir = b.t.TempDir()
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// The dashboard in a real browser, against a real queen, hive and
// llama.cpp worker on the test model, without tokens: the overview shows
// the pool, the model and the worker a request placed; the worker's page
// shows its row, placement, history and live log; stopping it from the
// page turns its row STOPPED, with the reason in the audit log (also as
// the page's filtered audit view shows it); a worker killed with SIGKILL
// turns FAILED on the open page without a reload; the playground streams
// a chat. The page loads with no console error (a CSP violation would be
// one).
func TestDashboardInBrowser(t *testing.T) {
	c := startCluster(t, nil)
	ctx := t.Context()
	if s := c.stream(ctx, completion(4), nil); s.err != nil {
		t.Fatalf("first request: %v", s.err)
	}
	id := c.rows()[0].ID

	// The page's files carry the strict policy.
	resp, err := http.Get(c.url + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("Content-Security-Policy"); got != dashboard.CSP || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /ui/: %d, CSP %q", resp.StatusCode, got)
	}

	b := newBrowser(t)
	b.run("open the dashboard", chromedp.Navigate(c.url+"/ui/"))
	b.wait("the pool", `[data-pool="node-1"][data-status="healthy"] [data-device="0"]`)
	b.wait("the model", `tr[data-model="tiny"]`)
	b.wait("the worker", fmt.Sprintf(`tr[data-worker=%q][data-status="RUNNING"]`, id))
	// The pool card names its workers as the table does (wk-…), and what
	// is loaded with its last use.
	b.waitText("the card's worker", `[data-pool="node-1"] [data-device="0"]`, func(s string) bool { return strings.Contains(s, "workers: "+id) })
	b.waitText("what is loaded", `[data-pool="node-1"] [data-loaded]`, func(s string) bool { return strings.Contains(s, "tiny used ") })
	var firstRender string
	b.eval(`document.body.dataset.firstRender`, &firstRender)
	t.Logf("the page drew the queen's state %s ms after it was asked for (a fresh browser)", firstRender)
	b.run("load it again", chromedp.Reload(), chromedp.WaitVisible(fmt.Sprintf(`tr[data-worker=%q]`, id), chromedp.ByQuery))
	b.eval(`(() => { const n = performance.getEntriesByType('navigation')[0]; const r = name => (performance.getEntriesByType('resource').find(e => e.name.endsWith(name)) || {}).responseEnd;
		return 'html ' + Math.round(n.responseEnd) + ' ms, app.js ' + Math.round(r('/ui/app.js')) + ' ms, DOMContentLoaded ' + Math.round(n.domContentLoadedEventEnd) + ' ms, state drawn ' + document.body.dataset.firstRender + ' ms' })()`, &firstRender)
	t.Logf("loaded again: %s (since the page was asked for)", firstRender)
	b.screenshot("overview")

	// The worker's page: its row, placement, history and log.
	b.run("open the worker", chromedp.Click(fmt.Sprintf(`tr[data-worker=%q] a`, id), chromedp.ByQuery))
	b.wait("the worker's row", fmt.Sprintf(`dl[data-worker=%q][data-status="RUNNING"]`, id))
	b.wait("its history", `#worker-history tr[data-action="worker.start"]`)
	b.waitText("its placement", "#worker-placement", func(s string) bool { return strings.Contains(s, "node-1") })
	b.waitText("its log", "#worker-log", func(s string) bool { return strings.Contains(s, "generation finished") })
	// A line the worker writes while its page is open reaches it.
	before := strings.Count(b.text("#worker-log"), "generation finished")
	if s := c.stream(ctx, completion(4), nil); s.err != nil {
		t.Fatalf("second request: %v", s.err)
	}
	b.waitText("a new log line", "#worker-log", func(s string) bool { return strings.Count(s, "generation finished") > before })
	b.screenshot("worker")

	// Stop it from the page.
	b.run("stop", chromedp.Click(`#worker-live [data-action="stop"]`, chromedp.ByQuery))
	b.confirm("stopped from the dashboard test")
	b.wait("STOPPED", fmt.Sprintf(`dl[data-worker=%q][data-status="STOPPED"]`, id))
	entries, err := c.admin.Audit(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range entries {
		found = found || e.Target == id && e.Action == "worker.stop" && e.Actor == "admin" && e.Reason == "stopped from the dashboard test"
	}
	if !found {
		t.Errorf("no worker.stop entry by admin with the page's reason for %s: %+v", id, entries)
	}
	b.run("the audit view", chromedp.Navigate(c.url+"/ui/#/audit?action=worker.stop&target="+id))
	b.wait("the stop entry", `tr[data-action="worker.stop"][data-actor="admin"]`)
	if got := b.text(`#audit-entries tbody`); !strings.Contains(got, "stopped from the dashboard test") || strings.Contains(got, "worker.start") {
		t.Errorf("the filtered audit view: %q", got)
	}
	// The whole audit log, its placement metadata the widest column:
	// nothing wider than the window.
	b.run("the whole audit log", chromedp.Navigate(c.url+"/ui/#/audit"))
	b.wait("a start entry", `tr[data-action="worker.start"]`)
	var wide bool
	b.eval(`document.documentElement.scrollWidth > window.innerWidth + 1`, &wide)
	if wide {
		t.Error("the audit log is wider than the window (its metadata column overflows)")
	}
	b.screenshot("audit")

	// A worker killed with SIGKILL turns FAILED on the open page.
	b.run("back to the overview", chromedp.Navigate(c.url+"/ui/#/"))
	if s := c.stream(ctx, completion(4), nil); s.err != nil {
		t.Fatalf("third request: %v", s.err)
	}
	var row api.LifecycleRow
	for _, r := range c.rows() {
		if r.Status == "RUNNING" {
			row = r
		}
	}
	if row.PID == nil {
		t.Fatalf("no RUNNING row with a pid: %+v", c.rows())
	}
	b.wait("the new worker", fmt.Sprintf(`tr[data-worker=%q][data-status="RUNNING"]`, row.ID))
	b.eval(`window.sameDocument = 1`, nil)
	killed := time.Now()
	if err := syscall.Kill(*row.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	b.wait("FAILED", fmt.Sprintf(`tr[data-worker=%q][data-status="FAILED"]`, row.ID))
	shown := time.Since(killed)
	var same bool
	b.eval(`window.sameDocument === 1`, &same)
	if !same {
		t.Error("the page was reloaded to show FAILED")
	}
	t.Logf("SIGKILL to FAILED on the page: %s", shown.Round(time.Millisecond))

	// The playground streams a chat through the queen.
	b.run("the playground", chromedp.Navigate(c.url+"/ui/#/playground"))
	b.run("a model to choose", chromedp.WaitReady(`#pg-model option[value="tiny"]`, chromedp.ByQuery))
	b.run("a prompt", chromedp.SendKeys("#pg-prompt", "Once upon a time", chromedp.ByQuery))
	// The answer is sampled (the playground sends no temperature), and
	// the test model may end it after its first token (about one answer
	// in fifty): up to three tries for an answer of two chunks or more.
	var meta string
	var n int
	for try := 0; try < 3 && n < 2; try++ {
		b.run("send a chat", chromedp.Click("#pg-send", chromedp.ByQuery))
		b.wait("the answer", `#pg-output[data-state="done"]`)
		meta = b.text("#pg-meta")
		n, _ = strconv.Atoi(strings.Fields(meta + " 0")[0])
	}
	if n < 2 || !strings.Contains(meta, "worker wk-") {
		t.Errorf("the playground's answer came in %q", meta)
	}
	b.screenshot("playground")

	// A phone-sized screen.
	b.run("a phone", emulation.SetDeviceMetricsOverride(390, 844, 1, true), chromedp.Navigate(c.url+"/ui/#/"))
	b.wait("the pool on a phone", `[data-pool="node-1"]`)
	var overflow bool
	b.eval(`document.documentElement.scrollWidth > window.innerWidth + 1`, &overflow)
	if overflow {
		t.Error("the overview is wider than a phone's screen")
	}
	b.screenshot("phone")
	b.checkClean()
}

// With tokens, the page shows nothing until the admin token is given: the
// data endpoints answer 401 and the page asks for the token; a wrong one
// is refused; the right one is kept in sessionStorage only, and
// everything shows. The page's state changes pass the queen's browser
// checks (same origin, JSON): draining and undraining the pool, and
// starting a worker of the model, from the page. The playground sends
// the API token it was given.
func TestDashboardNeedsTheAdminToken(t *testing.T) {
	c := startClusterWith(t, clusterOptions{apiToken: "ui-secret-0123456789"}, nil)
	adminToken := "admin-ui-secret-0123456789"
	for _, path := range []string{"/api/admin/ui/snapshot", "/api/admin/ui/events"} {
		resp, err := http.Get(c.url + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without a token: %d, want 401", path, resp.StatusCode)
		}
	}

	b := newBrowser(t)
	b.run("open the dashboard", chromedp.Navigate(c.url+"/ui/"))
	b.wait("the sign-in form", "#signin")
	var shown int
	b.eval(`document.querySelectorAll('[data-pool], [data-worker], [data-model]').length`, &shown)
	if shown != 0 {
		t.Errorf("%d items shown without the token", shown)
	}
	// The page asked /health whether the queen wants a token, and sent
	// nothing to be refused: no 401 in the console before the sign-in.
	var refused int
	b.eval(`performance.getEntriesByType('resource').filter(e => e.responseStatus === 401).length`, &refused)
	if refused != 0 {
		t.Errorf("%d requests answered 401 before the sign-in", refused)
	}
	b.run("a wrong token", chromedp.SendKeys("#admin-token", "wrong", chromedp.ByQuery), chromedp.Click("#signin-submit", chromedp.ByQuery))
	b.waitText("the refusal", "#signin-error", func(s string) bool { return strings.Contains(s, "bearer token") })

	b.eval(`document.querySelector('#admin-token').value = ''`, nil)
	b.run("the right token", chromedp.SendKeys("#admin-token", adminToken, chromedp.ByQuery),
		chromedp.SendKeys("#api-token", "ui-secret-0123456789", chromedp.ByQuery), chromedp.Click("#signin-submit", chromedp.ByQuery))
	b.wait("the pool", `[data-pool="node-1"][data-status="healthy"]`)
	b.wait("the model", `tr[data-model="tiny"]`)
	var kept string
	b.eval(`JSON.stringify([sessionStorage.getItem('apiary.adminToken'), localStorage.length, document.cookie])`, &kept)
	if want, _ := json.Marshal([]any{adminToken, 0, ""}); kept != string(want) {
		t.Errorf("the token is kept as %s, want %s (sessionStorage only)", kept, want)
	}

	b.run("drain", chromedp.Click(`[data-pool="node-1"] [data-action="drain"]`, chromedp.ByQuery))
	b.confirm("drained from the dashboard test")
	b.wait("draining", `[data-pool="node-1"][data-status="draining"] [data-action="undrain"]`)
	b.run("undrain", chromedp.Click(`[data-pool="node-1"] [data-action="undrain"]`, chromedp.ByQuery))
	b.confirm("undrained from the dashboard test")
	b.wait("healthy again", `[data-pool="node-1"][data-status="healthy"]`)
	entries, err := c.admin.Audit(t.Context(), "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		if e.Target == "node-1" && e.Actor == "admin" {
			got = append(got, e.Action+": "+e.Reason)
		}
	}
	if want := []string{"pool.undrain: undrained from the dashboard test", "pool.drain: drained from the dashboard test"}; strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the pool's admin entries: %q, want %q", got, want)
	}

	// Start a worker of the model from the page: the queen places it.
	b.run("start", chromedp.Click(`tr[data-model="tiny"] [data-action="start"]`, chromedp.ByQuery))
	b.confirm("started from the dashboard test")
	b.wait("the started worker", `#workers tr[data-status="RUNNING"]`)
	rows := c.rows()
	if len(rows) != 1 || rows[0].Owner != OwnerOperator || rows[0].Reason == "" {
		t.Fatalf("rows after Start: %+v", rows)
	}
	started := false
	entries, err = c.admin.Audit(t.Context(), "", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		started = started || e.Target == rows[0].ID && e.Action == "worker.start" && e.Actor == "admin" && e.Reason == "started from the dashboard test"
	}
	if !started {
		t.Errorf("no worker.start by admin with the page's reason: %+v", entries)
	}

	b.run("the playground", chromedp.Navigate(c.url+"/ui/#/playground"))
	b.run("a model to choose", chromedp.WaitReady(`#pg-model option[value="tiny"]`, chromedp.ByQuery))
	b.run("send a chat", chromedp.SendKeys("#pg-prompt", "Hello", chromedp.ByQuery),
		chromedp.Click("#pg-send", chromedp.ByQuery))
	b.wait("the answer", `#pg-output[data-state="done"]`)

	b.run("sign out", chromedp.Click("#signout", chromedp.ByQuery))
	b.wait("the sign-in form again", "#signin")
	b.eval(`document.querySelectorAll('[data-pool], [data-worker], [data-model]').length`, &shown)
	if shown != 0 {
		t.Errorf("%d items shown after signing out", shown)
	}
	b.checkClean()
}
