package worker

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// metricValue reads one sample of GET /metrics (no token), by its name.
func metricValue(t *testing.T, url, name string) string {
	t.Helper()
	res, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("GET /metrics: %d %s", res.StatusCode, b)
	}
	for l := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(l, name+`{model="tiny"} `); ok {
			return strings.TrimSpace(rest)
		}
	}
	t.Fatalf("no %s in /metrics:\n%s", name, b)
	return ""
}

// GET /metrics answers without the worker's token, in Prometheus's text
// format, what a gateway's endpoint picker reads: the requests running
// (one while a stream is held), waiting, the KV cache's use, the slots.
func TestBinaryMetrics(t *testing.T) {
	const token = "worker-token-0123456789"
	hold := t.TempDir()
	_, url := startWorkerBinaryOn(t, testModelPath(t), []string{"APIARY_WORKER_TOKEN=" + token, TestHoldEnv + "=" + hold}, "--slots", "2")
	if v := metricValue(t, url, "apiary_worker_requests_running"); v != "0" {
		t.Errorf("running at rest: %s", v)
	}
	if v := metricValue(t, url, "apiary_worker_slots"); v != "2" {
		t.Errorf("slots: %s, want 2", v)
	}
	if err := os.WriteFile(filepath.Join(hold, "tiny"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions",
		strings.NewReader(`{"prompt":"Once upon a time","max_tokens":8,"stream":true,"ignore_eos":true}`))
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	if !sc.Scan() { // the first piece: then it is held
		t.Fatalf("no first event: %v", sc.Err())
	}
	if v := metricValue(t, url, "apiary_worker_requests_running"); v != "1" {
		t.Errorf("running while a stream is held: %s, want 1", v)
	}
	if v := metricValue(t, url, "apiary_worker_requests_waiting"); v != "0" {
		t.Errorf("waiting: %s, want 0", v)
	}
	if err := os.Remove(filepath.Join(hold, "tiny")); err != nil {
		t.Fatal(err)
	}
	for sc.Scan() {
	}
	for deadline := time.Now().Add(10 * time.Second); metricValue(t, url, "apiary_worker_requests_running") != "0"; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a request still running after its stream ended")
		}
	}
	if v := metricValue(t, url, "apiary_worker_kv_cache_usage_ratio"); v != "0" {
		t.Errorf("KV cache use with nothing running: %s, want 0", v)
	}
}
