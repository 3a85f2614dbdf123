package queen

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	oai "github.com/openai/openai-go"
	"github.com/openai/openai-go/option"

	"github.com/apiary-llm/apiary/internal/keeper"
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
	front := listenAddr(t)
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

// listenAddr is a loopback address free a moment ago.
func listenAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Two queens on one PostgreSQL database, one hive configured with both,
// 4 streams of steady load through HAProxy in front of both: the second
// queen stands by (its /health
// 503 "standby" naming the active one), and when the active is SIGKILLed
// it takes over within 5 s, requests are served again within 10 s of the
// kill by the same worker (not restarted: same row, same process), and
// the audit shows the takeover.
func TestProcessQueenFailover(t *testing.T) {
	u, err := pg.NewDatabase(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	a1, a2 := listenAddr(t), listenAddr(t)
	url1, url2 := "http://"+a1, "http://"+a2
	q1, _ := startQueenProc(t, "", u, "--addr", a1)
	q2 := startProc(t, "queen 2", nil, "queen", "--addr", a2, "--flush-interval", "100ms", "--database-url", u)
	q2.logs.wait(t, 0, "queen standing by: another queen holds the database", map[string]string{"active": url1})
	resp, err := http.Get(url2 + "/health")
	if err != nil {
		t.Fatal(err)
	}
	var health map[string]string
	_ = json.NewDecoder(resp.Body).Decode(&health)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || health["status"] != "standby" || health["active"] != url1 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("the standby's /health: %d %v (Retry-After %q)", resp.StatusCode, health, resp.Header.Get("Retry-After"))
	}

	hive := startHiveProc(t, url1+","+url2, "node-1", 300*time.Millisecond)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("hive logs:\n%s", hive.logs.String())
			t.Logf("queen 2 logs:\n%s", q2.logs.String())
		}
		_ = hive.stop(t, syscall.SIGTERM)
		_ = q2.stop(t, syscall.SIGTERM)
	})
	q1.logs.wait(t, 0, "pool status changed", map[string]string{"pool_id": "node-1", "to": "healthy"})
	started, err := keeper.NewClient(url1, "", "").StartWorker(t.Context(), "tiny", "node-1", nil, "failover test")
	if err != nil {
		t.Fatal(err)
	}
	q1.logs.wait(t, 0, "lifecycle row changed", map[string]string{"lifecycle_id": started.LifecycleID, "to": "RUNNING"})
	before, err := keeper.NewClient(url1, "", "").Workers(t.Context(), keeper.WorkerFilter{})
	if err != nil || len(before) != 1 || before[0].PID == nil {
		t.Fatalf("rows before: %+v, %v", before, err)
	}

	// Clients go through HAProxy, which sends them to the queen whose
	// /health answers 200.
	lb := startHAProxy(t, a1, a2)
	clients := []oai.Client{oai.NewClient(option.WithBaseURL(lb+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))}
	for deadline := time.Now().Add(waitLimit); ; time.Sleep(50 * time.Millisecond) {
		if _, err := clients[0].Completions.New(t.Context(), completion(2)); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("no request served through HAProxy: %v", err)
		}
	}
	var mu sync.Mutex
	var served []time.Time
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, c := range clients {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					_, err := c.Completions.New(ctx, completion(2))
					cancel()
					if err == nil {
						mu.Lock()
						served = append(served, time.Now())
						mu.Unlock()
						break
					}
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	time.Sleep(time.Second)
	_ = q1.stop(t, syscall.SIGKILL)
	killed := time.Now() // the process is gone: nothing it answered counts after this
	rec, _ := q2.logs.wait(t, 0, "queen serving", nil)
	active := logTime(t, rec).Sub(killed)
	var again time.Duration
	for deadline := time.Now().Add(20 * time.Second); again == 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		mu.Lock()
		for _, at := range served {
			if at.After(killed) {
				again = at.Sub(killed)
				break
			}
		}
		mu.Unlock()
	}
	close(stop)
	wg.Wait()
	t.Logf("the standby was active %s after the kill; requests were served again %s after the kill", active.Round(time.Millisecond), again.Round(time.Millisecond))
	if active > 5*time.Second {
		t.Errorf("the standby took over %s after the kill, want within 5s", active)
	}
	if again == 0 || again > 10*time.Second {
		t.Errorf("requests served again %s after the kill, want within 10s", again)
	}
	after, err := keeper.NewClient(url2, "", "").Workers(t.Context(), keeper.WorkerFilter{})
	if err != nil || len(after) != 1 || after[0].ID != started.LifecycleID || after[0].Status != "RUNNING" || *after[0].PID != *before[0].PID {
		t.Errorf("rows after the takeover: %+v, %v; want %s RUNNING, pid %d (not restarted)", after, err, started.LifecycleID, *before[0].PID)
	}
	entries, err := keeper.NewClient(url2, "", "").Audit(t.Context(), "", 0)
	if err != nil {
		t.Fatal(err)
	}
	took := 0
	for _, e := range entries {
		if e.Action == "queen.takeover" {
			took++
		}
	}
	if took != 1 {
		t.Errorf("%d queen.takeover entries in the audit, want 1", took)
	}

	// The first queen comes back as the standby; the active one is cut off
	// from the database (its lock session terminated while it runs): it
	// steps down within 2 s and the standby takes over again.
	q3 := startProc(t, "queen 3", nil, "queen", "--addr", a1, "--flush-interval", "100ms", "--database-url", u)
	t.Cleanup(func() { _ = q3.stop(t, syscall.SIGTERM) })
	q3.logs.wait(t, 0, "queen standing by: another queen holds the database", map[string]string{"active": url2})
	killQueenLock(t, u)
	cut := time.Now()
	rec, _ = q2.logs.wait(t, 0, "queen stepping down", nil)
	if down := logTime(t, rec).Sub(cut); down > 2*time.Second {
		t.Errorf("the queen cut off from the database stepped down %s after, want within 2s", down)
	}
	rec, _ = q3.logs.wait(t, 0, "queen serving", nil)
	t.Logf("cut off: the other queen was active %s after", logTime(t, rec).Sub(cut).Round(time.Millisecond))
	for deadline := cut.Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, err := clients[0].Completions.New(t.Context(), completion(2))
		if err == nil {
			t.Logf("cut off: served through HAProxy again %s after", time.Since(cut).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no request served through HAProxy within 10s of the cut: %v", err)
		}
	}
	final, err := keeper.NewClient(url1, "", "").Workers(t.Context(), keeper.WorkerFilter{})
	if err != nil || len(final) != 1 || final[0].ID != started.LifecycleID || final[0].Status != "RUNNING" || *final[0].PID != *before[0].PID {
		t.Errorf("rows after the second takeover: %+v, %v", final, err)
	}
}
