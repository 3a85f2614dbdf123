//go:build !race

package queen

// The soak: under a steady load of completions through the
// queen, workers, a hive and the queen are SIGKILLed at random and
// restarted; afterwards the live lifecycle rows are exactly the worker
// processes that run, nothing is orphaned, no message between the daemons
// grew, and no daemon's memory grew grossly (RSS at start and end is
// logged). -soak sets how long the chaos lasts: a minute in CI, an hour by
// hand (figures in docs/queen.md, "Soak"):
//
//	go test -count=1 -timeout 90m -run TestSoak -v ./internal/queen/ -args -soak 1h

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

var soakFor = flag.Duration("soak", time.Minute, "how long TestSoak kills and restarts daemons under load (CI: 1m; by hand: 1h)")

const (
	soakPause     = 4 * time.Second  // mean pause between two kills
	soakRequest   = 2 * time.Minute  // a request still open this long counts as hung
	soakSettle    = 2 * time.Minute  // bound on the wait for rows and processes to agree
	rssEvery      = 2 * time.Second  // RSS sampling period
	rssWarmup     = 10 * time.Second // a daemon's "start" RSS is its first sample this long after it started
	entryMax      = 2 << 10          // bytes: a heartbeat's worker entry, an event
	entryGrowth   = 512              // bytes a late entry may exceed the early ones by (pids, ports, reasons vary)
	grossFactor   = 3
	grossAbsMiB   = 200
	grossSlackMiB = 32 // growth below this many MiB is never gross, whatever the factor
)

// liveStatuses are the row statuses of a worker that should be running.
var liveStatuses = []string{"STARTING", "RUNNING", "DRAINING"}

// A queen on SQLite and two operator hives with one-thread workers; hive
// node-a lives through the whole soak (its workers are killed), node-b is
// killed and restarted on its data dir, the queen on its data dir and
// port. The hives reach the queen through a proxy that measures every
// heartbeat and event.
func TestSoak(t *testing.T) {
	s := newSoak(t)
	start := time.Now()
	s.wire.setWindow(start, start.Add(*soakFor))
	load, stopLoad := context.WithCancel(t.Context())
	var clients sync.WaitGroup
	for i, pool := range []string{"node-a", "node-b", ""} { // pinned, so that each hive has workers to lose
		clients.Go(func() { s.client(load, uint64(i), pool) })
	}
	var sampler sync.WaitGroup
	sampling, stopSampling := context.WithCancel(t.Context())
	sampler.Go(func() { s.sampleRSS(sampling) })
	t.Cleanup(func() { // also when the test failed half-way
		stopLoad()
		clients.Wait()
		stopSampling()
		sampler.Wait()
	})

	rng := rand.New(rand.NewPCG(uint64(start.UnixNano()), 12))
	var deck []int // kills in a random order, each kind in every five: a minute sees them all
	for time.Since(start) < *soakFor {
		pause := soakPause/2 + time.Duration(rng.Int64N(int64(soakPause)))
		select {
		case <-time.After(pause):
		case <-t.Context().Done():
			t.Fatal("test context ended")
		}
		if len(deck) == 0 {
			deck = []int{0, 1, 2, 3, 4}
			rng.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
		}
		kill := deck[0]
		deck = deck[1:]
		switch kill {
		case 0, 1:
			s.killWorker(t, rng)
		case 2:
			s.restart(t, s.hiveB)
		case 3:
			s.restart(t, s.queen)
		case 4:
			s.freeze(t, rng)
		}
	}
	chaos := time.Since(start)
	stopLoad()
	clients.Wait()

	final := s.awaitAgreement(t)
	stopSampling()
	sampler.Wait()
	s.report(t, chaos, final)
	s.stop(t)
}

// soak is the cluster under test and what was counted.
type soak struct {
	root  string // every process of the test names it on its command line
	addr  string // the queen's host:port, kept across its restarts
	url   string
	admin *keeper.Client
	http  *http.Transport
	oai   oai.Client
	wire  *wireWatch
	proxy *httptest.Server

	queen, hiveA, hiveB *daemon

	mu       sync.Mutex     // guards the fields below and every daemon's p and lives
	kills    map[string]int // by kind: worker, hive, queen, queen freeze
	noVictim int            // worker kills that found no worker
	ok       [2]int         // completions in full: [0] whole, [1] streamed
	failed   map[string]int // by kind (errKind)
}

// daemon is one of the soak's daemons across its restarts.
type daemon struct {
	name  string
	start func(t *testing.T) *proc // starts an incarnation and waits until it serves
	p     *proc
	lives []*life
}

// life is one incarnation of a daemon and its RSS samples.
type life struct {
	pid                     int
	began, ended            time.Time
	first, start, end, peak int64 // VmRSS bytes; start is the first sample after rssWarmup
}

func newSoak(t *testing.T) *soak {
	t.Helper()
	root := t.TempDir()
	s := &soak{root: root, kills: map[string]int{}, failed: map[string]int{}, wire: newWireWatch()}
	queenDir := filepath.Join(root, "queen")
	queenArgs := []string{"--heartbeat-timeout", "3s", "--unhealthy-grace", "2s", "--queue-timeout", "15s",
		"--max-workers", "3", "--scale-up-after", "500ms"}
	s.queen = &daemon{name: "queen", start: func(t *testing.T) *proc {
		args := queenArgs
		if s.addr != "" {
			args = append(slices.Clone(queenArgs), "--addr", s.addr) // the same port: hives and clients find it again
		}
		p, u := startQueenProc(t, queenDir, "", args...)
		s.url, s.addr = u, strings.TrimPrefix(u, "http://")
		return p
	}}
	s.start(t, s.queen)
	s.proxy = httptest.NewServer(s.wire.proxyTo(s.url))
	s.hiveA = s.hiveDaemon(t, "node-a", "25000-25499")
	s.hiveB = s.hiveDaemon(t, "node-b", "25500-25999")
	s.http = &http.Transport{}
	s.admin = keeper.NewClient(s.url, "", "")
	s.oai = oai.NewClient(option.WithBaseURL(s.url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0),
		option.WithHTTPClient(&http.Client{Transport: s.http}))
	t.Cleanup(func() {
		s.proxy.Close()
		s.wire.transport.CloseIdleConnections()
		s.http.CloseIdleConnections()
	})
	for _, id := range []string{"node-a", "node-b"} {
		s.queen.p.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": id, "to": "healthy"})
	}
	return s
}

// hiveDaemon starts an operator hive for pool id with the test model.
func (s *soak) hiveDaemon(t *testing.T, id, ports string) *daemon {
	t.Helper()
	dir := filepath.Join(s.root, id)
	if err := os.MkdirAll(filepath.Join(dir, "models"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := testmodel.WriteFile(filepath.Join(dir, "models", "tiny.gguf"), testmodel.Options{}); err != nil {
		t.Fatal(err)
	}
	d := &daemon{name: "hive " + id, start: func(t *testing.T) *proc {
		p := startProc(t, "hive "+id, nil, "hive", "--addr", "127.0.0.1:0", "--queen", s.proxy.URL, "--pool-id", id,
			"--data-dir", dir, "--heartbeat-interval", "500ms", "--worker-ports", ports, "--worker-threads", "1")
		p.logs.wait(t, 0, "hive serving", nil)
		return p
	}}
	s.start(t, d)
	return d
}

func (s *soak) start(t *testing.T, d *daemon) {
	t.Helper()
	p := d.start(t)
	s.mu.Lock()
	defer s.mu.Unlock()
	d.p = p
	d.lives = append(d.lives, &life{pid: p.PID(), began: time.Now()})
}

// restart SIGKILLs d's incarnation, waits for its exit and starts the
// next on the same data dir.
func (s *soak) restart(t *testing.T, d *daemon) {
	t.Helper()
	s.mu.Lock()
	l := d.lives[len(d.lives)-1]
	s.sampleLocked(l)
	l.ended = time.Now()
	p := d.p
	if d == s.queen {
		s.kills["queen"]++
	} else {
		s.kills["hive"]++
	}
	s.mu.Unlock()
	if err := p.stop(t, syscall.SIGKILL); err == nil {
		t.Fatalf("%s exited cleanly after SIGKILL", d.name)
	}
	s.start(t, d)
}

// freeze stops the queen (SIGSTOP) for 0.5–6 s, a GC pause or a stalled
// VM, at times past the hives' heartbeat timeout (3 s), and lets it go on
// (SIGCONT): it wakes with beats and requests waiting, and must not take
// the workers that ran meanwhile for lost.
func (s *soak) freeze(t *testing.T, rng *rand.Rand) {
	t.Helper()
	s.mu.Lock()
	pid := s.queen.p.cmd.Process.Pid
	s.kills["queen freeze"]++
	s.mu.Unlock()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	select {
	case <-time.After(500*time.Millisecond + time.Duration(rng.Int64N(int64(5500*time.Millisecond)))):
	case <-t.Context().Done():
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

// workers lists the pids of the `apiary worker` processes of the test.
func (s *soak) workers() []int {
	var out []int
	for _, pid := range testbin.Matching(s.root) {
		if args := strings.Fields(testbin.Cmdline(pid)); len(args) > 1 && args[1] == "worker" {
			out = append(out, pid)
		}
	}
	slices.Sort(out)
	return out
}

func (s *soak) killWorker(t *testing.T, rng *rand.Rand) {
	t.Helper()
	pids := s.workers()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(pids) == 0 {
		s.noVictim++
		return
	}
	if err := syscall.Kill(pids[rng.IntN(len(pids))], syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		t.Fatal(err)
	}
	s.kills["worker"]++
}

// client sends completions of 8 to 64 tokens, whole or streamed, until
// ctx ends, and counts how each ended; with pool, pinned to that pool.
func (s *soak) client(ctx context.Context, seed uint64, pool string) {
	rng := rand.New(rand.NewPCG(seed, uint64(time.Now().UnixNano())))
	c := &cluster{client: s.oai}
	var opts []option.RequestOption
	if pool != "" {
		opts = append(opts, option.WithHeader(api.PoolHeader, pool))
	}
	for ctx.Err() == nil {
		n := 8 + rng.IntN(57)
		streamedToo := rng.IntN(2)
		rctx, cancel := context.WithTimeout(ctx, soakRequest)
		var err error
		if streamedToo == 1 {
			r := c.stream(rctx, completion(n), nil, opts...)
			if err = r.err; err == nil && r.tokens != int64(n) {
				err = fmt.Errorf("short answer: %d of %d tokens", r.tokens, n)
			}
		} else {
			var resp *oai.Completion
			resp, err = s.oai.Completions.New(rctx, completion(n), append(opts, ignoreEOS)...)
			if err == nil && resp.Usage.CompletionTokens != int64(n) {
				err = fmt.Errorf("short answer: %d of %d tokens", resp.Usage.CompletionTokens, n)
			}
		}
		cancel()
		if ctx.Err() != nil {
			return // cut short by the end of the load: not counted
		}
		s.mu.Lock()
		if err == nil {
			s.ok[streamedToo]++
		} else {
			s.failed[errKind(err)]++
		}
		s.mu.Unlock()
		if err != nil {
			select { // something is down: do not spin on it
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
			}
		}
	}
}

var digits = regexp.MustCompile(`[0-9]+`)

// errKind names how a request failed: the status and code of an error
// answer, the transport error, or the error's text without its numbers.
func errKind(err error) string {
	var apiErr *oai.Error
	switch {
	case errors.As(err, &apiErr):
		return fmt.Sprintf("%d %s", apiErr.StatusCode, apiErr.Code)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("no answer within %s", soakRequest)
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed"
	}
	msg := err.Error()
	for _, code := range []string{"worker_failed", "worker_unreachable", "upstream_error"} {
		if strings.Contains(msg, code) {
			return "stream error event " + code
		}
	}
	msg = digits.ReplaceAllString(msg, "N")
	if len(msg) > 100 {
		msg = msg[:100] + "…"
	}
	return msg
}

// sampleRSS samples every daemon's RSS until ctx ends.
func (s *soak) sampleRSS(ctx context.Context) {
	tick := time.NewTicker(rssEvery)
	defer tick.Stop()
	for {
		s.mu.Lock()
		for _, d := range []*daemon{s.queen, s.hiveA, s.hiveB} {
			s.sampleLocked(d.lives[len(d.lives)-1])
		}
		s.mu.Unlock()
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

func (s *soak) sampleLocked(l *life) {
	if !l.ended.IsZero() {
		return
	}
	rss, err := vmRSS(l.pid)
	if err != nil {
		return // it is being killed
	}
	if l.first == 0 {
		l.first = rss
	}
	if l.start == 0 && time.Since(l.began) >= rssWarmup {
		l.start = rss
	}
	l.end, l.peak = rss, max(l.peak, rss)
}

// vmRSS reads a process's resident set size from /proc/PID/status.
func vmRSS(pid int) (int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}

// agreement is one look at rows and processes.
type agreement struct {
	rows    []api.LifecycleRow // live ones
	workers []int              // worker processes
	pools   map[string]string  // pool id → status
	problem string             // "" when they agree
}

// look compares the live rows with the worker processes: each live row
// has a pid that is a worker of the test, and each worker is a live row's.
func (s *soak) look(ctx context.Context) agreement {
	var a agreement
	for _, st := range liveStatuses {
		rows, err := s.admin.Workers(ctx, keeper.WorkerFilter{Status: st, Limit: maxListLimit})
		if err != nil {
			a.problem = "rows: " + err.Error()
			return a
		}
		a.rows = append(a.rows, rows...)
	}
	pools, err := s.admin.Pools(ctx, keeper.PoolFilter{})
	if err != nil {
		a.problem = "pools: " + err.Error()
		return a
	}
	a.pools = map[string]string{}
	for _, p := range pools {
		a.pools[p.PoolID] = p.Status
	}
	a.workers = s.workers()
	var problems []string
	for _, id := range []string{"node-a", "node-b"} {
		if a.pools[id] != "healthy" {
			problems = append(problems, fmt.Sprintf("pool %s is %q", id, a.pools[id]))
		}
	}
	rowPIDs := map[int]string{}
	for _, r := range a.rows {
		switch {
		case r.PID == nil:
			problems = append(problems, fmt.Sprintf("row %s (%s on %s) has no pid", r.ID, r.Status, r.PoolID))
		case !slices.Contains(a.workers, *r.PID):
			problems = append(problems, fmt.Sprintf("row %s (%s on %s) names pid %d, which is no worker that runs", r.ID, r.Status, r.PoolID, *r.PID))
		case !strings.Contains(testbin.Cmdline(*r.PID), filepath.Join(s.root, r.PoolID)):
			problems = append(problems, fmt.Sprintf("row %s (%s on %s) names pid %d, a worker of another hive: %s",
				r.ID, r.Status, r.PoolID, *r.PID, testbin.Cmdline(*r.PID)))
		default:
			rowPIDs[*r.PID] = r.ID
		}
	}
	for _, pid := range a.workers {
		if _, ok := rowPIDs[pid]; !ok {
			problems = append(problems, fmt.Sprintf("orphan: worker pid %d has no live row: %s", pid, testbin.Cmdline(pid)))
		}
	}
	a.problem = strings.Join(problems, "; ")
	return a
}

// awaitAgreement waits, up to soakSettle, until the live rows and the
// worker processes agree on two looks a second apart (the daemons stay
// up; the load and the chaos are over).
func (s *soak) awaitAgreement(t *testing.T) agreement {
	t.Helper()
	deadline := time.Now().Add(soakSettle)
	var a agreement
	agreed := 0
	for time.Now().Before(deadline) {
		a = s.look(t.Context())
		if a.problem == "" {
			agreed++
		} else {
			agreed = 0
		}
		if agreed == 2 {
			return a
		}
		time.Sleep(time.Second) // one heartbeat interval and then some: a poll, not a guess
	}
	t.Errorf("live rows and worker processes still disagree %s after the chaos: %s", soakSettle, a.problem)
	return a
}

// report logs what the soak counted and checks messages and memory.
func (s *soak) report(t *testing.T, chaos time.Duration, final agreement) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range []*daemon{s.queen, s.hiveA, s.hiveB} {
		s.sampleLocked(d.lives[len(d.lives)-1])
	}
	t.Logf("soak: %s of chaos on %d CPUs; kills: worker %d (%d times none ran), hive %d, queen %d; queen freezes %d; restarts: hive %d, queen %d",
		chaos.Round(time.Second), nproc(), s.kills["worker"], s.noVictim, s.kills["hive"], s.kills["queen"], s.kills["queen freeze"],
		len(s.hiveB.lives)-1, len(s.queen.lives)-1)
	failed := 0
	var kinds []string
	for _, k := range slices.Sorted(maps.Keys(s.failed)) {
		failed += s.failed[k]
		kinds = append(kinds, fmt.Sprintf("%s: %d", k, s.failed[k]))
	}
	t.Logf("requests: %d ok (%d whole, %d streamed), %d failed [%s]", s.ok[0]+s.ok[1], s.ok[0], s.ok[1], failed, strings.Join(kinds, "; "))
	if s.ok[0] == 0 || s.ok[1] == 0 {
		t.Errorf("no whole or no streamed completion succeeded in %s", chaos)
	}
	if n := s.failed[fmt.Sprintf("no answer within %s", soakRequest)]; n > 0 {
		t.Errorf("%d requests hung for %s", n, soakRequest)
	}
	var live []string
	for _, r := range final.rows {
		live = append(live, fmt.Sprintf("%s %s on %s pid %d", r.ID, r.Status, r.PoolID, *r.PID))
	}
	t.Logf("test process (it keeps every daemon's log): %s", soakSelfRSS())
	var rows []string
	q := &cluster{t: t, url: s.url}
	for _, st := range []string{"STARTING", "RUNNING", "DRAINING", "STOPPED", "FAILED"} {
		rows = append(rows, st+" "+q.metric(`apiary_queen_worker_rows{status="`+st+`"}`))
	}
	t.Logf("rows by status: %s", strings.Join(rows, ", "))
	t.Logf("final: %d live rows = %d worker processes [%s]; pools %v", len(final.rows), len(final.workers), strings.Join(live, "; "), final.pools)

	w := s.wire
	w.mu.Lock()
	defer w.mu.Unlock()
	t.Logf("messages: %d heartbeats (largest %d bytes; largest worker entry %d bytes in the first third, %d in the last), "+
		"%d events (largest %d bytes in the first third, %d in the last); %d heartbeat entries refused; queen's answers %v",
		w.beats, w.maxBeat, w.early.entry, w.late.entry, w.events, w.early.event, w.late.event, w.refused, w.answers)
	for kind, n := range w.answers {
		if strings.HasSuffix(kind, " 413") {
			t.Errorf("the queen answered %d times %s: a message outgrew its limit", n, kind)
		}
	}
	for what, sizes := range map[string][2]int{"worker entry": {w.early.entry, w.late.entry}, "event": {w.early.event, w.late.event}} {
		over := w.over.entry
		if what == "event" {
			over = w.over.event
		}
		if over > entryMax {
			t.Errorf("largest %s %d bytes, want at most %d", what, over, entryMax)
		}
		if sizes[0] > 0 && sizes[1] > sizes[0]+entryGrowth {
			t.Errorf("%s grew: %d bytes at most in the first third, %d in the last", what, sizes[0], sizes[1])
		}
	}

	for _, d := range []*daemon{s.queen, s.hiveA, s.hiveB} {
		s.reportRSS(t, d)
	}
	for _, id := range []string{"node-a", "node-b"} {
		n, size := dirSize(filepath.Join(s.root, id, "hive", "logs"))
		t.Logf("worker log files of hive %s: %d, %s", id, n, mib(size))
	}
}

// dirSize counts the files under dir and their bytes.
func dirSize(dir string) (n int, size int64) {
	_ = filepath.WalkDir(dir, func(_ string, e os.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			if info, err := e.Info(); err == nil {
				n, size = n+1, size+info.Size()
			}
		}
		return nil
	})
	return n, size
}

// rssListed is how many incarnations of a daemon are logged one by one;
// past it, a summary and the longest-lived one.
const rssListed = 6

// reportRSS logs d's RSS at the start and end of each incarnation and
// fails on gross growth within one.
func (s *soak) reportRSS(t *testing.T, d *daemon) {
	lived := func(l *life) time.Duration {
		end := l.ended
		if end.IsZero() {
			end = time.Now()
		}
		return end.Sub(l.began).Round(time.Second)
	}
	line := func(i int, l *life) string {
		return fmt.Sprintf("%s #%d pid %d lived %s: first %s, start %s, end %s, peak %s", d.name, i+1, l.pid,
			lived(l), mib(l.first), mib(l.start), mib(l.end), mib(l.peak))
	}
	longest := 0
	var lo, hi int64 // end RSS over all incarnations
	for i, l := range d.lives {
		if len(d.lives) <= rssListed {
			t.Logf("rss %s", line(i, l))
		}
		if lived(l) > lived(d.lives[longest]) {
			longest = i
		}
		if l.end > 0 && (lo == 0 || l.end < lo) {
			lo = l.end
		}
		hi = max(hi, l.end)
		grew := l.end - l.start
		if l.start > 0 && (grew > grossAbsMiB<<20 || (l.end > grossFactor*l.start && grew > grossSlackMiB<<20)) {
			t.Errorf("%s (pid %d) grew from %s to %s", d.name, l.pid, mib(l.start), mib(l.end))
		}
	}
	if len(d.lives) > rssListed {
		t.Logf("rss %s: %d incarnations, end RSS %s to %s; the longest-lived: %s", d.name, len(d.lives), mib(lo), mib(hi),
			line(longest, d.lives[longest]))
	}
}

// soakSelfRSS is the test process's own RSS: it keeps every daemon's log.
func soakSelfRSS() string {
	rss, _ := vmRSS(os.Getpid())
	return mib(rss)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func nproc() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return bytes.Count(b, []byte("\nprocessor")) + 1
}

// stop ends the cluster as an operator would (SIGTERM: hives first, then
// the queen) and checks that not one process of the test is left.
func (s *soak) stop(t *testing.T) {
	t.Helper()
	for _, d := range []*daemon{s.hiveA, s.hiveB, s.queen} {
		if err := d.p.stop(t, syscall.SIGTERM); err != nil {
			t.Errorf("%s exit after SIGTERM: %v", d.name, err)
		}
	}
	took := testbin.AwaitGone(t, s.root, waitLimit)
	t.Logf("every process of the test gone %s after the queen", took.Round(time.Millisecond))
}

// wireWatch is a reverse proxy between the hives and the queen that
// measures each heartbeat and event and counts the queen's answers. When
// the queen is down it drops the hive's connection, as a dead queen
// would.
type wireWatch struct {
	transport *http.Transport

	mu                sync.Mutex
	third1, third3    time.Time // the end of the chaos's first third, the start of its last
	beats, events     int
	maxBeat           int
	refused           int            // heartbeat entries the queen refused
	early, late, over sizes          // largest in the first third, the last third, over all
	answers           map[string]int // "heartbeat 200", "event unreachable", …
}

// sizes are the largest messages seen, in bytes.
type sizes struct{ entry, event int }

func (z *sizes) see(entry, event int) { z.entry, z.event = max(z.entry, entry), max(z.event, event) }

func newWireWatch() *wireWatch {
	return &wireWatch{transport: &http.Transport{}, answers: map[string]int{}}
}

func (w *wireWatch) setWindow(start, end time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	third := end.Sub(start) / 3
	w.third1, w.third3 = start.Add(third), end.Add(-third)
}

// kind names a hive's call to the queen by its path.
func kind(path string) string {
	switch {
	case strings.HasSuffix(path, "/heartbeat"):
		return "heartbeat"
	case strings.HasSuffix(path, "/beats"):
		return "stream"
	case path == "/v2/internal/workers/events":
		return "event"
	case path == "/v2/pools/register":
		return "register"
	}
	return path
}

// see measures one message of kind k.
func (w *wireWatch) see(k string, body []byte) {
	entry, event := 0, 0
	switch k {
	case "heartbeat":
		var hb struct{ Workers []json.RawMessage }
		_ = json.Unmarshal(body, &hb)
		for _, e := range hb.Workers {
			entry = max(entry, len(e))
		}
	case "event":
		event = len(body)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch k {
	case "heartbeat":
		w.beats++
		w.maxBeat = max(w.maxBeat, len(body))
	case "event":
		w.events++
	}
	now := time.Now()
	w.over.see(entry, event)
	if !w.third1.IsZero() && now.Before(w.third1) {
		w.early.see(entry, event)
	}
	if !w.third3.IsZero() && now.After(w.third3) {
		w.late.see(entry, event)
	}
}

func (w *wireWatch) answer(k, what string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.answers[k+" "+what]++
}

// beatAnswer counts one heartbeat's answer: its status, and the entries
// it refused.
func (w *wireWatch) beatAnswer(status int, body []byte) {
	w.answer("heartbeat", strconv.Itoa(status))
	var a api.HeartbeatAnswer
	if status == http.StatusOK && json.Unmarshal(body, &a) == nil && len(a.Refused) > 0 {
		w.mu.Lock()
		w.refused += len(a.Refused)
		w.mu.Unlock()
	}
}

// lineTap passes a stream through and calls line with each whole line
// that went by: the heartbeats of a heartbeat stream, and their answers.
type lineTap struct {
	io.ReadCloser
	line    func([]byte)
	pending []byte
}

func (l *lineTap) Read(p []byte) (int, error) {
	n, err := l.ReadCloser.Read(p)
	l.pending = append(l.pending, p[:n]...)
	for {
		i := bytes.IndexByte(l.pending, '\n')
		if i < 0 {
			break
		}
		l.line(l.pending[:i])
		l.pending = l.pending[i+1:]
	}
	return n, err
}

// proxyTo serves as the queen at target for the hives.
func (w *wireWatch) proxyTo(target string) http.Handler {
	u, err := url.Parse(target)
	if err != nil {
		panic(err)
	}
	rp := &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(u) },
		Transport: w.transport,
		ModifyResponse: func(resp *http.Response) error {
			k := kind(resp.Request.URL.Path)
			switch {
			case k == "stream" && resp.StatusCode == http.StatusOK:
				w.answer(k, "opened")
				resp.Body = &lineTap{ReadCloser: resp.Body, line: func(b []byte) {
					var e api.LineError
					if json.Unmarshal(b, &e) == nil && e.Status != 0 {
						w.beatAnswer(e.Status, b)
					} else {
						w.beatAnswer(http.StatusOK, b)
					}
				}}
				return nil
			case k != "heartbeat" || resp.StatusCode != http.StatusOK:
				w.answer(k, strconv.Itoa(resp.StatusCode))
				return nil
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			resp.Body = io.NopCloser(bytes.NewReader(body))
			w.beatAnswer(resp.StatusCode, body)
			return err
		},
		ErrorHandler: func(_ http.ResponseWriter, r *http.Request, _ error) {
			w.answer(kind(r.URL.Path), "unreachable")
			panic(http.ErrAbortHandler) // the hive sees its connection dropped
		},
	}
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if kind(r.URL.Path) == "stream" {
			// Each heartbeat is measured as it goes by; the answer's
			// lines flow back while the body still does.
			_ = http.NewResponseController(rw).EnableFullDuplex()
			r.Body = &lineTap{ReadCloser: r.Body, line: func(b []byte) { w.see("heartbeat", b) }}
			rp.ServeHTTP(rw, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		w.see(kind(r.URL.Path), body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		rp.ServeHTTP(rw, r)
	})
}
