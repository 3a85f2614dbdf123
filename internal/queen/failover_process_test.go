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

	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/store/pgtest"
	"github.com/apiary-llm/apiary/internal/testbin"
)

// startHAProxy runs HAProxy (Debian's package; scripts/deps.sh installs
// it) in front of the queens at addrs, as docs/deploy.md configures it:
// a server is used while its GET /health answers 200 (a standby answers
// 503), checked every 300 ms. It returns HAProxy's base URL.
func startHAProxy(t *testing.T, addrs ...string) string {
	t.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		t.Fatalf("haproxy is not installed (scripts/deps.sh installs it): %v", err)
	}
	front := testbin.FreeAddr(t)
	var servers strings.Builder
	for i, a := range addrs {
		fmt.Fprintf(&servers, "    server queen%d %s check\n", i+1, a)
	}
	cfg := filepath.Join(t.TempDir(), "haproxy.cfg")
	conf := fmt.Sprintf(haproxyConfig, front, servers.String())
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-db", "-f", cfg)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("haproxy:\n%s", out.String())
		}
	})
	return "http://" + front
}

// haproxyConfig is docs/deploy.md's HAProxy configuration with the
// addresses left to fill in (the frontend's, then the server lines).
const haproxyConfig = `defaults
    mode http
    timeout connect 1s
    timeout client 60s
    timeout server 60s
    retries 3
    option redispatch
frontend apiary
    bind %s
    default_backend queens
backend queens
    option httpchk
    http-check send meth GET uri /health ver HTTP/1.1 hdr Host localhost
    http-check expect status 200
    default-server inter 300ms fall 1 rise 1
%s`

// failoverRoundsEnv sets the rounds of TestProcessQueenFailover (default
// 4: one of each fault in failoverFaults, which more rounds repeat in
// turn; docs/deploy.md's soak ran 20).
const failoverRoundsEnv = "APIARY_FAILOVER_ROUNDS"

// failoverFaults are what ends the active queen in the rounds of
// TestProcessQueenFailover, in turn.
var failoverFaults = []string{"SIGKILL", "cut off", "partition", "SIGSTOP"}

// failoverLease is the lease the queens of TestProcessQueenFailover run
// with (--lease-duration, --lease-renew): short, so that a round takes
// seconds; the bounds the test asserts derive from it.
// APIARY_FAILOVER_LEASE and APIARY_FAILOVER_RENEW set others (the queen's
// defaults, 4s and 1s, for the figure in docs/deploy.md).
var failoverLease, failoverRenew = envDuration("APIARY_FAILOVER_LEASE", 2*time.Second), envDuration("APIARY_FAILOVER_RENEW", 250*time.Millisecond)

// envDuration is the duration in the environment variable name, or def.
func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil && d > 0 {
		return d
	}
	return def
}

// Two queens on one PostgreSQL database, each with a data dir of its own
// (the batch files live in the database), one hive configured with both,
// 4 streams of steady load through HAProxy in front of both and a running
// batch, and an input file uploaded to the first queen that a batch is
// made of after the first takeover. The second queen stands
// by (its /health 503 "standby" naming the active one). Each queen
// reaches PostgreSQL through a relay of its own (pgtest.Relay). Then
// rounds, each ending the active queen in one of four ways, in turn:
// SIGKILL; its lock's database session terminated while it runs; a
// partition (its relay stops passing bytes: connections open, nothing
// answered, the server keeps its sessions); SIGSTOP (frozen). The
// standby is active within 5 s of the fault (the cut-off queen steps down
// within 2 s; the partitioned one stops acting before the standby takes
// over), requests are served through HAProxy again within 10 s, by the
// same worker (same row, same process). When the fault heals (the relay
// passes bytes again, SIGCONT), the old queen writes nothing: it steps
// down at once (its lease ran out on its own clock), answers as a
// standby, and exits; it is started again as the standby. The batch ends
// with every request once, and the audit has one queen.takeover a round;
// the batch made after the takeover, of the file the first queen took,
// ends with every request once too.
func TestProcessQueenFailover(t *testing.T) {
	rounds := len(failoverFaults)
	if v := os.Getenv(failoverRoundsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a number of rounds", failoverRoundsEnv, v)
		}
		rounds = n
	}
	u, err := pg.NewDatabase(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	dirs := []string{t.TempDir(), t.TempDir()}
	addrs := []string{testbin.FreeAddr(t), testbin.FreeAddr(t)}
	urls := []string{"http://" + addrs[0], "http://" + addrs[1]}
	// Each queen reaches the database through a relay of its own.
	var relays [2]*pgtest.Relay
	var dbURLs [2]string
	for i := range relays {
		if relays[i], err = pgtest.NewRelay(u); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(relays[i].Close)
		if dbURLs[i], err = relays[i].URL(u); err != nil {
			t.Fatal(err)
		}
	}
	lease := []string{"--lease-duration", failoverLease.String(), "--lease-renew", failoverRenew.String()}
	startStandby := func(i int, active string) *proc {
		t.Helper()
		q := startProc(t, fmt.Sprintf("queen %d", i+1), nil, append([]string{"queen", "--addr", addrs[i], "--flush-interval", "100ms",
			"--database-url", dbURLs[i], "--data-dir", dirs[i]}, lease...)...)
		q.logs.wait(t, 0, "queen standing by: another queen holds the database", map[string]string{"active": active})
		return q
	}
	q1, _ := startQueenProc(t, "", dbURLs[0], append([]string{"--addr", addrs[0], "--data-dir", dirs[0]}, lease...)...)
	queens := []*proc{q1, startStandby(1, urls[0])}
	t.Cleanup(func() {
		for _, q := range queens {
			_ = q.stop(t, syscall.SIGTERM)
		}
	})
	resp, err := http.Get(urls[1] + "/health")
	if err != nil {
		t.Fatal(err)
	}
	var health map[string]string
	_ = json.NewDecoder(resp.Body).Decode(&health)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || health["status"] != "standby" || health["active"] != urls[0] || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("the standby's /health: %d %v (Retry-After %q)", resp.StatusCode, health, resp.Header.Get("Retry-After"))
	}
	// A watchdog's liveness check is 200 on both: each process answers.
	for i, u := range urls {
		resp, err := http.Get(u + "/health/live")
		if err != nil {
			t.Fatal(err)
		}
		var live api.Liveness
		_ = json.NewDecoder(resp.Body).Decode(&live)
		resp.Body.Close()
		want := map[int]string{0: "active", 1: "standby"}[i]
		if resp.StatusCode != http.StatusOK || live.Status != "live" || live.Role != want || i == 1 && live.Active != urls[0] {
			t.Errorf("queen %d's /health/live: %d %+v, want 200 %s", i+1, resp.StatusCode, live, want)
		}
	}

	hive := startHiveProc(t, urls[0]+","+urls[1], "node-1", 300*time.Millisecond)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("hive logs:\n%s", hive.logs.String())
			for i, q := range queens {
				t.Logf("queen %d logs:\n%s", i+1, q.logs.String())
			}
		}
		_ = hive.stop(t, syscall.SIGTERM)
	})
	q1.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "node-1", "to": "healthy"})
	started, err := keeper.NewClient(urls[0], "", "").StartWorker(t.Context(), "tiny", "node-1", nil, "failover test")
	if err != nil {
		t.Fatal(err)
	}
	q1.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": started.LifecycleID, "to": "RUNNING"})
	before, err := keeper.NewClient(urls[0], "", "").Workers(t.Context(), keeper.WorkerFilter{})
	if err != nil || len(before) != 1 || before[0].PID == nil {
		t.Fatalf("rows before: %+v, %v", before, err)
	}

	// Clients go through HAProxy, which sends them to the queen whose
	// /health answers 200.
	lb := startHAProxy(t, addrs...)
	client := oai.NewClient(option.WithBaseURL(lb+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	// HAProxy takes a queen as up until its next check: wait until it
	// sends nothing to a standby (its requests take turns, so six answered
	// in a row means the standby is out).
	settle := func() {
		t.Helper()
		for inARow, deadline := 0, time.Now().Add(waitLimit); inARow < 6; time.Sleep(20 * time.Millisecond) {
			if _, err := client.Completions.New(t.Context(), completion(2)); err == nil {
				inARow++
			} else if inARow = 0; time.Now().After(deadline) {
				t.Fatalf("requests through HAProxy still fail: %v", err)
			}
		}
	}
	settle()
	const n = 40
	batch := newBatch(t, client, n, 8)
	// Taken by the first queen; the second makes a batch of it after it
	// took over, reading the file from the database (no data dir is
	// shared).
	later, err := upload(t, client, batchFile(n, 8))
	if err != nil {
		t.Fatal(err)
	}
	var batch2 string
	var mu sync.Mutex
	var served []time.Time
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err := client.Completions.New(ctx, completion(2))
				cancel()
				if err == nil {
					mu.Lock()
					served = append(served, time.Now())
					mu.Unlock()
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	servedAfter := func(from time.Time) time.Duration {
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			mu.Lock()
			for _, at := range served {
				if at.After(from) {
					mu.Unlock()
					return at.Sub(from)
				}
			}
			mu.Unlock()
		}
		return 0
	}
	time.Sleep(500 * time.Millisecond)

	// The standby takes over when the lease lapses, at most failoverLease
	// after the fault, and tries every failoverRenew: 5 s (the bar) leaves
	// it 2.75 s to start on a loaded machine with the test's 2 s lease.
	takeoverBound := failoverLease + 3*time.Second
	active := 0
	for round := range rounds {
		old, next := active, 1-active
		fault := failoverFaults[round%len(failoverFaults)]
		var from time.Time
		// The old queen's writes before it could have noticed: none may
		// follow the fault's healing.
		changedBefore := 0
		switch fault {
		case "cut off":
			killQueenLock(t, u)
			from = time.Now()
			rec, _ := queens[old].logs.wait(t, 0, "queen stepping down", nil)
			if down := logTime(t, rec).Sub(from); down > 2*time.Second {
				t.Errorf("round %d: the queen cut off from the database stepped down %s after, want within 2s", round, down)
			}
			select {
			case <-queens[old].done:
			case <-time.After(waitLimit):
				t.Fatalf("round %d: the queen that stepped down still runs", round)
			}
		case "SIGKILL":
			_ = queens[old].stop(t, syscall.SIGKILL)
			from = time.Now() // the process is gone: nothing it answered counts after this
		case "partition":
			relays[old].Freeze()
			from = time.Now()
		case "SIGSTOP":
			queens[old].Signal(syscall.SIGSTOP)
			from = time.Now()
			changedBefore = queens[old].logs.Count("lifecycle row changed", nil)
		}
		rec, _ := queens[next].logs.wait(t, 0, "queen serving", nil)
		took := logTime(t, rec).Sub(from)
		taken, _ := queens[next].logs.wait(t, 0, "fencing epoch taken", nil)
		switch fault {
		case "partition":
			// The partitioned queen stopped acting on its own clock
			// before the standby took the lease: never two actives.
			down, _ := queens[old].logs.wait(t, 0, "queen stepping down", nil)
			if !logTime(t, down).Before(logTime(t, taken)) {
				t.Errorf("round %d: the partitioned queen stepped down at %s, not before the standby took the lease at %s",
					round, down.Attrs["time"], taken.Attrs["time"])
			}
			changedBefore = queens[old].logs.Count("lifecycle row changed", nil)
			relays[old].Thaw()
		case "SIGSTOP":
			queens[old].Signal(syscall.SIGCONT)
			// It wakes past its lease's deadline: it steps down before it
			// acts, and answers as a standby while it stops.
			down, _ := queens[old].logs.wait(t, 0, "queen stepping down", nil)
			if !strings.Contains(down.Attrs["err"], "lease") {
				t.Errorf("round %d: the woken queen stepped down for %q, want its lease", round, down.Attrs["err"])
			}
		}
		if fault == "partition" || fault == "SIGSTOP" {
			select {
			case <-queens[old].done:
			case <-time.After(waitLimit):
				t.Fatalf("round %d: the queen deposed by a %s still runs", round, fault)
			}
			if n := queens[old].logs.Count("lifecycle row changed", nil); n != changedBefore {
				t.Errorf("round %d: the queen deposed by a %s changed %d lifecycle rows after the fault", round, fault, n-changedBefore)
			}
		}
		again := servedAfter(from)
		t.Logf("round %d (%s of queen %d): queen %d active %s after, served through HAProxy again %s after",
			round, fault, old+1, next+1, took.Round(time.Millisecond), again.Round(time.Millisecond))
		if took > takeoverBound {
			t.Errorf("round %d: the standby took over %s after, want within %s", round, took, takeoverBound)
		}
		if again == 0 || again > 10*time.Second {
			t.Errorf("round %d: requests served again %s after, want within 10s", round, again)
		}
		rows, err := keeper.NewClient(urls[next], "", "").Workers(t.Context(), keeper.WorkerFilter{})
		if err != nil || len(rows) != 1 || rows[0].ID != started.LifecycleID || rows[0].Status != "RUNNING" || *rows[0].PID != *before[0].PID {
			t.Fatalf("round %d: rows after the takeover: %+v, %v; want %s RUNNING, pid %d (not restarted)", round, rows, err, started.LifecycleID, *before[0].PID)
		}
		// The row's process is the one that runs.
		if err := syscall.Kill(*rows[0].PID, 0); err != nil {
			t.Fatalf("round %d: the RUNNING row's process %d: %v", round, *rows[0].PID, err)
		}
		queens[old] = startStandby(old, urls[next])
		active = next
		if round == 0 {
			direct := oai.NewClient(option.WithBaseURL(urls[next]+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
			b, err := direct.Batches.New(t.Context(),
				oai.BatchNewParams{InputFileID: later.ID, Endpoint: oai.BatchNewParamsEndpointV1ChatCompletions, CompletionWindow: oai.BatchNewParamsCompletionWindow24h})
			if err != nil {
				t.Fatalf("a batch of the file the first queen took, made on queen %d after the takeover: %v", next+1, err)
			}
			batch2 = b.ID
		}
	}

	// The batches end with every request once, whoever finished them, and
	// their output files are read from whichever queen is active.
	settle()
	for _, id := range []string{batch, batch2} {
		var b *oai.Batch
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
			if b, err = client.Batches.Get(t.Context(), id); err == nil && (b.Status == oai.BatchStatusCompleted || b.Status == oai.BatchStatusFailed) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("batch %s did not end: %+v, %v", id, b, err)
			}
		}
		completedOnce(t, client, b, n)
	}
	entries, err := keeper.NewClient(urls[active], "", "").AuditQuery(t.Context(), keeper.AuditFilter{Action: "queen.takeover", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != rounds {
		t.Errorf("%d queen.takeover entries in the audit after %d rounds", len(entries), rounds)
	}
	// No lifecycle transition is on record twice (a queen that took over
	// applying again what the other had).
	all, err := keeper.NewClient(urls[active], "", "").AuditQuery(t.Context(), keeper.AuditFilter{Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int64{}
	for _, e := range all {
		from, to := e.Metadata["from"], e.Metadata["to"]
		if from == nil || to == nil || !api.IsLifecycleID(e.Target) {
			continue // a pool's transitions come again at each takeover (restored unhealthy until its hive beats)
		}
		key := fmt.Sprintf("%s %v→%v", e.Target, from, to)
		if id, twice := seen[key]; twice {
			t.Errorf("transition %s audited twice: entries %d and %d", key, id, e.ID)
		}
		seen[key] = e.ID
	}
	if len(seen) == 0 {
		t.Errorf("no lifecycle transition in the audit of %d entries", len(all))
	}
}
