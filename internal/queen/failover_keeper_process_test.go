//go:build !race

package queen

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/testbin"
)

// apiaryWith runs the apiary binary to its end with env added to this
// process's environment, and returns its stdout.
func apiaryWith(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(testbin.Path(t), args...)
	cmd.Env = append(cmd.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("apiary %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

// The keeper given two queens on one PostgreSQL database, the standby
// first (--queen, and APIARY_QUEEN the other way round), runs `workers
// ls`, `pools ls` and the admin writes `pools drain` / `pools undrain`
// at the active queen; after the active queen is SIGKILLed and the
// standby took over, the same commands with the same lists still work
// (the dead queen refuses the connection, and is skipped). Each write is
// in the audit once.
func TestProcessKeeperFollowsTheActiveQueen(t *testing.T) {
	u, err := pg.NewDatabase(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	addrs := []string{testbin.FreeAddr(t), testbin.FreeAddr(t)}
	urls := []string{"http://" + addrs[0], "http://" + addrs[1]}
	q1, _ := startQueenProc(t, "", u, "--addr", addrs[0], "--data-dir", t.TempDir())
	q2 := startProc(t, "queen 2", nil, "queen", "--addr", addrs[1], "--flush-interval", "100ms", "--database-url", u, "--data-dir", t.TempDir())
	q2.logs.wait(t, 0, "queen standing by: another queen holds the database", map[string]string{"active": urls[0]})
	hive := startHiveProc(t, urls[0]+","+urls[1], "node-1", 300*time.Millisecond)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("queen 1 logs:\n%s", q1.logs.String())
			t.Logf("queen 2 logs:\n%s", q2.logs.String())
		}
		_ = hive.stop(t, syscall.SIGTERM)
		_ = q2.stop(t, syscall.SIGTERM)
		_ = q1.stop(t, syscall.SIGTERM)
	})
	q1.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "node-1", "to": "healthy"})

	standbyFirst := urls[1] + "," + urls[0]
	env := []string{"APIARY_QUEEN=" + urls[0] + "," + urls[1]} // the active (to be killed) first
	drains := 0
	commands := func(when string) {
		t.Helper()
		for _, how := range []struct {
			env  []string
			args []string
		}{{nil, []string{"--queen", standbyFirst}}, {env, nil}} {
			if _, err := apiaryWith(t, how.env, append([]string{"workers", "ls"}, how.args...)...); err != nil {
				t.Fatalf("%s: %v", when, err)
			}
			reason := fmt.Sprintf("keeper test %d", drains)
			if _, err := apiaryWith(t, how.env, append([]string{"pools", "drain", "node-1", "--reason", reason}, how.args...)...); err != nil {
				t.Fatalf("%s: %v", when, err)
			}
			drains++
			out, err := apiaryWith(t, how.env, append([]string{"pools", "ls", "--json"}, how.args...)...)
			var pools api.PoolList
			if err != nil || json.Unmarshal([]byte(out), &pools) != nil || len(pools.Pools) != 1 || pools.Pools[0].Status != "draining" {
				t.Fatalf("%s: pools after the drain: %s, %v", when, out, err)
			}
			if _, err := apiaryWith(t, how.env, append([]string{"pools", "undrain", "node-1", "--reason", reason}, how.args...)...); err != nil {
				t.Fatalf("%s: %v", when, err)
			}
		}
	}
	commands("both queens up")

	if err := q1.stop(t, syscall.SIGKILL); err == nil {
		t.Fatal("queen 1 exited 0 on SIGKILL")
	}
	q2.logs.wait(t, 0, "queen serving", nil)
	commands("after the takeover")

	out, err := apiaryWith(t, nil, "audit", "--json", "--limit", "1000", "--queen", standbyFirst)
	var audit api.AuditList
	if err != nil || json.Unmarshal([]byte(out), &audit) != nil {
		t.Fatalf("audit: %s, %v", out, err)
	}
	for i := range drains {
		n := 0
		for _, e := range audit.Entries {
			if e.Action == "pool.drain" && e.Reason == fmt.Sprintf("keeper test %d", i) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("drain %d is in the audit %d times, want once", i, n)
		}
	}
}
