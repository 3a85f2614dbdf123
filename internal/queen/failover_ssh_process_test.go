//go:build !race

package queen

import (
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/procs"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testnodes"
)

// failoverTokens are the queens' tokens: they serve on the bridge, where
// the nodes reach them, so they have all three.
var failoverTokens = []string{"APIARY_API_TOKEN=test-api-0123456789", "APIARY_ADMIN_TOKEN=test-admin-0123456789",
	"APIARY_CLUSTER_TOKEN=test-cluster-0123456789"}

// failoverHeartbeat is the queens' --heartbeat-timeout: the lease of the
// hives they start, and how long a pool without a beat stays healthy.
const failoverHeartbeat = 3 * time.Second

// failoverStopGrace is the --stop-grace of the queens' hives: how long a
// frozen worker holds up its hive's cascade, longer than the new active
// takes to reach the node over SSH.
const failoverStopGrace = 5 * time.Second

// A node's hive across takeovers: two queen processes on one PostgreSQL
// database (--heartbeat-timeout 3s, --unhealthy-grace 1s), the active one
// with an SSH node (n1, node 1) whose hive it started, and an operator's
// hive on node 2 (pool op, given both queens, with a worker). Each round
// starts a worker on n1, freezes it (SIGSTOP: the old hive's cascade then
// takes failoverStopGrace), then ends the active queen — SIGKILL in the
// first round, its database session terminated (pg_terminate_backend)
// while it runs in the second, when its /health must answer 503 while it
// stops its hive — and the standby takes over. Then: the old queen's hive
// and worker are gone from node 1; node 1 runs exactly one hive, started
// by the new active (its --queen is the new active's URL, its ssh session
// is the new active's child, `nodes ls` there says running, pool n1
// registered there since the takeover and healthy); no worker runs on
// node 1 and no row of n1 is live (the old worker's row ended); node 1
// never ran two hives at once, and the new active started its hive within
// half a heartbeat timeout of the old one's end, having found the old hive
// still answering and waited (no "address already in use" retry, no
// "external" verdict); the operator's hive and worker run on, their row
// RUNNING (with a 1 s grace the new active would write them off while the
// stepped-down queen still took the hive's beats); the audit has one
// queen.takeover a round. The ended queen comes back as the standby for
// the next round.
func TestProcessQueenFailoverSSHNode(t *testing.T) {
	nodes := sshNodes.Get(t)
	u, err := pg.NewDatabase(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var addrs, urls [2]string
	for i := range addrs {
		addrs[i] = net.JoinHostPort(nodes.HostIP(), strconv.Itoa(testbin.FreePortOn(t, nodes.HostIP())))
		urls[i] = "http://" + addrs[i]
	}
	clients := [2]*keeper.Client{}
	for i := range clients {
		clients[i] = keeper.NewClient(urls[i], "test-admin-0123456789", "test-cluster-0123456789")
		clients[i].SetTimeout(time.Minute)
	}
	var queens [2]*proc
	start := func(i int, active string) {
		t.Helper()
		q := startProc(t, fmt.Sprintf("queen %d", i+1), failoverTokens, "queen", "--addr", addrs[i], "--database-url", u, "--data-dir", dir,
			"--flush-interval", "100ms", "--heartbeat-timeout", failoverHeartbeat.String(), "--unhealthy-grace", "1s",
			"--lease-duration", failoverLease.String(), "--lease-renew", failoverRenew.String(),
			"--ssh-config", nodes.SSHConfig("ssh_config"), "--ssh-timeout", "2s", "--hive-stop-timeout", "20s",
			"--hive-arg=--worker-threads=1", "--hive-arg=--stop-grace="+failoverStopGrace.String(), "--hive-arg=--shutdown-ack=1s")
		if active == "" {
			q.logs.wait(t, 0, "queen serving", nil)
		} else {
			q.logs.wait(t, 0, "queen standing by: another queen holds the database", map[string]string{"active": active})
		}
		queens[i] = q
	}
	start(0, "")
	start(1, urls[0])
	var op *testbin.Proc
	t.Cleanup(func() {
		if t.Failed() {
			for i, q := range queens {
				t.Logf("queen %d logs:\n%s", i+1, q.logs.String())
			}
			if op != nil {
				t.Logf("operator's hive logs:\n%s", op.Lines.String())
			}
		}
		for _, q := range queens {
			_ = q.stop(t, syscall.SIGTERM)
		}
	})

	if _, err := clients[0].AddNode(t.Context(), api.AddNodeRequest{Name: "n1", SSH: "root@" + nodes.Addr(1),
		InstallDir: filepath.Join(nodes.Dir(1), "bin")}); err != nil {
		t.Fatalf("add node n1: %v", err)
	}
	queens[0].logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "n1", "to": "healthy"})

	// The operator's hive follows whichever queen is active.
	op = testbin.StartCmd(t, "operator hive", failoverTokens, "ip", "netns", "exec", nodes.Namespace(2), testbin.Path(t),
		"hive", "--addr", nodes.Addr(2)+":9300", "--queen", urls[0]+","+urls[1], "--pool-id", "op", "--worker-threads", "1",
		"--data-dir", filepath.Join(nodes.Dir(2), "data", "apiary"), "--heartbeat-interval", "300ms", "--log-json")
	queens[0].logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "op", "to": "healthy"})
	opRow, err := clients[0].StartWorker(t.Context(), "tiny", "op", nil, "operator's worker")
	if err != nil {
		t.Fatal(err)
	}
	queens[0].logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": opRow.LifecycleID, "to": "RUNNING"})
	opWorker := nodeProcs(t, nodes, 2, "worker")
	if len(opWorker) != 1 {
		t.Fatalf("node 2 runs workers %v, want the operator's one", opWorker)
	}

	active := 0
	waited := 0 // rounds whose new active waited for the old hive
	for round, cut := range []bool{false, true} {
		old, next := active, 1-active
		how := map[bool]string{false: "SIGKILL", true: "cut off from PostgreSQL"}[cut]
		row, err := clients[old].StartWorker(t.Context(), "tiny", "n1", nil, "failover test")
		if err != nil {
			t.Fatal(err)
		}
		queens[old].logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": row.LifecycleID, "to": "RUNNING"})
		oldHive, oldWorker := nodeProcs(t, nodes, 1, "hive"), nodeProcs(t, nodes, 1, "worker")
		if len(oldHive) != 1 || len(oldWorker) != 1 || !strings.Contains(oldHive[0].Cmd, "--queen "+urls[old]+" ") {
			t.Fatalf("round %d: node 1 runs hives %v and workers %v, want one of each, the hive queen %d's", round, oldHive, oldWorker, old+1)
		}

		// The old worker is frozen, so that the old hive's cascade takes
		// failoverStopGrace (no shutdown ack, the stop grace, then
		// SIGKILL): the new active finds it still answering.
		if err := syscall.Kill(oldWorker[0].PID, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		// Watch node 1 from now on: the most hives it ran at once.
		watch := watchHives(t, nodes, 1)
		var from time.Time
		if cut {
			killQueenLock(t, u)
			from = time.Now()
			queens[old].logs.wait(t, 0, "queen stepping down", nil)
			// While it stops its hive it answers as a standby: hives that
			// follow the queens move on, a load balancer takes it out.
			if resp, err := http.Get(urls[old] + "/health"); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
				t.Errorf("round %d: /health of the queen that stepped down: %v %v; want 503 standby while it stops", round, resp, err)
			} else {
				resp.Body.Close()
			}
			select {
			case <-queens[old].done:
			case <-time.After(waitLimit + 20*time.Second): // its hive's cascade, then its exit
				t.Fatalf("round %d: the queen that stepped down still runs", round)
			}
		} else {
			_ = queens[old].stop(t, syscall.SIGKILL)
			from = time.Now()
		}
		rec, _ := queens[next].logs.wait(t, 0, "queen serving", nil)
		took := logTime(t, rec).Sub(from)

		// The old hive and its worker go: the old queen's death signal
		// ended its ssh session (SIGKILL), or it cut the hive's lifeline
		// as it stepped down.
		gone := awaitDead(t, from, oldHive[0].PID, oldWorker[0].PID)
		// The new active starts its hive on the node; it registers.
		rec, _ = queens[next].logs.wait(t, 0, "hive started", map[string]string{"node": "n1"})
		started := logTime(t, rec).Sub(from)
		var hives []testnodes.Proc
		var left []api.LifecycleRow
		var pool []api.Pool
		deadline := time.Now().Add(waitLimit)
		for {
			hives = nodeProcs(t, nodes, 1, "hive")
			workers := nodeProcs(t, nodes, 1, "worker")
			rows, err := clients[next].Workers(t.Context(), keeper.WorkerFilter{PoolID: "n1"})
			if err != nil {
				t.Fatal(err)
			}
			left = slices.DeleteFunc(rows, func(r api.LifecycleRow) bool { return r.Status == "STOPPED" || r.Status == "FAILED" })
			if pool, err = clients[next].Pools(t.Context(), keeper.PoolFilter{Status: "healthy"}); err != nil {
				t.Fatal(err)
			}
			pool = slices.DeleteFunc(pool, func(p api.Pool) bool { return p.PoolID != "n1" || p.RegisteredAt.Before(from) })
			if len(hives) == 1 && len(workers) == 0 && len(left) == 0 && len(pool) == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: node 1 runs hives %v and workers %v, live rows of n1 %+v, pool n1 healthy since a registration after the takeover %v; want one hive, registered with queen %d, no worker, no live row",
					round, hives, workers, left, pool, next+1)
			}
			time.Sleep(50 * time.Millisecond)
		}
		settled := time.Since(from)
		most := watch()
		t.Logf("round %d (%s of queen %d): queen %d active %s after; the old hive and worker gone %s after; queen %d started its hive on n1 %s after; one hive, registered, and no live row %s after; most hives at once on node 1: %d",
			round, how, old+1, next+1, took.Round(time.Millisecond), gone.Round(time.Millisecond), next+1, started.Round(time.Millisecond),
			settled.Round(time.Millisecond), most)

		if !strings.Contains(hives[0].Cmd, "--queen "+urls[next]+" ") {
			t.Errorf("round %d: node 1's hive is not queen %d's: %s", round, next+1, hives[0].Cmd)
		}
		// (The old hive stops listening, which the new active sees, a
		// moment before its process is gone, which the test sees.)
		if most > 1 || started-gone > failoverHeartbeat/2 {
			t.Errorf("round %d: node 1 ran %d hives at once; the new one started %s after, the old one gone %s after: want one at a time, the new one started within %s of the old one's end (not after the pool's lease)",
				round, most, started, gone, failoverHeartbeat/2)
		}
		// Whether the new active finds the old hive still answering when
		// it looks at the node depends on which comes first, its look or
		// the old hive's end (both are right: the checks above hold either
		// way); the rounds together must take the waiting path once.
		if queens[next].logs.Has("a hive that has not registered with this queen answers for the node's pool; waiting until it registers or ends", map[string]string{"node": "n1"}) {
			waited++
		} else {
			t.Logf("round %d: queen %d did not find the old hive answering when it looked at the node", round, next+1)
		}
		ns, err := clients[next].Nodes(t.Context())
		if err != nil || len(ns) != 1 || ns[0].Name != "n1" || ns[0].Hive.State != api.HiveRunning {
			t.Fatalf("round %d: nodes on queen %d: %+v, %v; want n1 running", round, next+1, ns, err)
		}
		if s, err := procs.ReadStat(ns[0].Hive.PID); err != nil || s.PPID != queens[next].PID() {
			t.Errorf("round %d: n1's ssh session (pid %d) is not queen %d's child: %+v %v", round, ns[0].Hive.PID, next+1, s, err)
		}
		// On this side too, nothing of the old queen's is left: the one
		// ssh to node 1 (its command line names the node's install dir)
		// is the new active's session.
		var sessions []int
		for _, pid := range testbin.Matching(nodes.Marker(1) + "bin") {
			if strings.HasPrefix(testbin.Cmdline(pid), "ssh ") {
				sessions = append(sessions, pid)
			}
		}
		if len(sessions) != 1 || sessions[0] != ns[0].Hive.PID {
			t.Errorf("round %d: ssh processes to node 1: %v, want only queen %d's session %d", round, sessions, next+1, ns[0].Hive.PID)
		}
		for _, msg := range []string{"hive of the queen not running; will try again", "a hive the queen did not start serves the node's pool; not starting one"} {
			if queens[next].logs.Has(msg, map[string]string{"node": "n1"}) {
				t.Errorf("round %d: queen %d logged %q for n1", round, next+1, msg)
			}
		}
		if r, err := clients[next].Workers(t.Context(), keeper.WorkerFilter{PoolID: "op", Status: "RUNNING"}); err != nil || len(r) != 1 || r[0].ID != opRow.LifecycleID {
			t.Errorf("round %d: running rows of op: %+v %v; want the operator's worker's", round, r, err)
		}
		select {
		case <-op.Done():
			t.Fatalf("round %d: the operator's hive exited; no queen may stop what it did not start", round)
		default:
		}
		if !testbin.Alive(opWorker[0].PID) {
			t.Fatalf("round %d: the operator's worker %d died", round, opWorker[0].PID)
		}
		entries, err := clients[next].AuditQuery(t.Context(), keeper.AuditFilter{Action: "queen.takeover", Limit: 100})
		if err != nil || len(entries) != round+1 {
			t.Errorf("round %d: queen.takeover entries %+v, %v; want %d", round, entries, err, round+1)
		}
		start(old, urls[next])
		active = next
	}
	if waited == 0 {
		t.Error("in no round did the new active find the old hive answering (it should have waited for it)")
	}

	// The active stops (SIGTERM): node 1's hive stops with it, the
	// operator's runs on.
	if err := queens[active].stop(t, syscall.SIGTERM); err != nil {
		t.Errorf("queen %d exit after SIGTERM: %v", active+1, err)
	}
	if left := nodeProcs(t, nodes, 1, ""); len(left) > 0 {
		t.Errorf("node 1 runs %v after its queen stopped", left)
	}
	if !testbin.Alive(opWorker[0].PID) {
		t.Errorf("the operator's worker died")
	}
}

// nodeProcs lists the apiary processes of role ("" for all) on node i.
func nodeProcs(t *testing.T, nodes *testnodes.Nodes, i int, role string) []testnodes.Proc {
	t.Helper()
	ps, err := nodes.Apiary(i)
	if err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(ps, func(p testnodes.Proc) bool { return role != "" && p.Role != role })
}

// watchHives counts the hives on node i every 20 ms until the returned
// function is called (or the test ends), which returns the most it saw
// at once.
func watchHives(t *testing.T, nodes *testnodes.Nodes, i int) func() int {
	stop := make(chan struct{})
	most := 0 // written by the watcher until it returns
	var wg sync.WaitGroup
	var once sync.Once
	end := func() { once.Do(func() { close(stop); wg.Wait() }) }
	t.Cleanup(end)
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			n := 0
			if ps, err := nodes.Apiary(i); err == nil {
				for _, p := range ps {
					if p.Role == "hive" {
						n++
					}
				}
			}
			most = max(most, n)
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
	return func() int { end(); return most }
}

// awaitDead waits until every pid is gone and returns how long after from
// the last went.
func awaitDead(t *testing.T, from time.Time, pids ...int) time.Duration {
	t.Helper()
	for _, pid := range pids {
		testbin.AwaitDead(t, pid, waitLimit)
	}
	return time.Since(from)
}
