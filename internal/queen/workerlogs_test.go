package queen

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
)

// The queen's answers for logs it cannot give: each says why, with a code
// of its own (the live and ended logs themselves are in
// TestWorkerLogsThroughTheQueen, with real processes).
func TestWorkerLogsRefusals(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	x.register("a") // its hive, at 127.0.0.1:1, does not answer
	live := x.start("tiny", "a").LifecycleID
	x.hive.set(&HiveError{Status: http.StatusInsufficientStorage, Code: "insufficient_memory", Message: "no room"}, nil)
	x.do("POST", "/api/admin/workers", "", api.AdminWorkerRequest{Action: "start", Model: "tiny", PoolID: "a", Reason: "refused"})
	var never string
	for _, r := range x.storeRows() {
		if r.ID != live {
			never = r.ID
		}
	}
	for _, tc := range []struct {
		path   string
		status int
		code   string
		says   string
	}{
		{"/api/admin/workers/wk-0000000000000000/logs", 404, "worker_not_found", "wk-0000000000000000"},
		{"/api/admin/workers/worker-1/logs", 400, "invalid_request", "lifecycle id"},
		{"/api/admin/workers/" + live + "/logs?tail=0", 400, "invalid_request", "tail"},
		{"/api/admin/workers/" + live + "/logs?tail=10001", 400, "invalid_request", "tail"},
		{"/api/admin/workers/" + live + "/logs?follow=yes", 400, "invalid_request", "follow"},
		{"/api/admin/workers/" + live + "/logs?since=1h", 400, "invalid_request", "unknown query parameter"},
		{"/api/admin/workers/" + never + "/logs", 404, "log_not_found", "never started on its hive"},
		{"/api/admin/workers/" + live + "/logs", 502, "hive_unreachable", "the hive of pool a (" + fakeEndpoint("a") + ") does not answer"},
	} {
		status, body := x.do("GET", tc.path, "", nil)
		if status != tc.status || !strings.Contains(string(body), `"code":"`+tc.code+`"`) || !strings.Contains(string(body), tc.says) {
			t.Errorf("GET %s: %d %s, want %d %s saying %q", tc.path, status, body, tc.status, tc.code, tc.says)
		}
	}
	x.ok("DELETE", "/v2/pools/a", api.PoolAction{Reason: "gone"}, http.StatusOK, nil)
	status, body := x.do("GET", "/api/admin/workers/"+live+"/logs", "", nil)
	if status != http.StatusServiceUnavailable || !strings.Contains(string(body), "pool_unavailable") || !strings.Contains(string(body), "pool a of worker "+live+" is offline") {
		t.Errorf("logs of a worker whose pool is gone: %d %s", status, body)
	}
}

// followHive is a fake hive whose logs never end by themselves: one line,
// then nothing until the request's context ends.
type followHive struct{ *fakeHive }

func (followHive) WorkerLogs(ctx context.Context, _, _ string, q api.LogQuery) (io.ReadCloser, error) {
	pr, pw := io.Pipe()
	go func() {
		_, _ = io.WriteString(pw, "hello\n")
		<-ctx.Done()
		pw.CloseWithError(ctx.Err())
	}()
	return pr, nil
}

// A follower of a worker that runs on does not hold up the queen's
// shutdown: its stream ends at once and Run returns nil (not after the
// server's 10 s grace with an error).
func TestLogFollowersEndAtShutdown(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "", func(c *Config) { c.Hives = followHive{c.Hives.(*fakeHive)} })
	x.register("a")
	id := x.start("tiny", "a").LifecycleID
	resp, err := http.Get(x.url + "/api/admin/workers/" + id + "/logs?follow=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); line != "hello\n" || resp.StatusCode != http.StatusOK {
		t.Fatalf("followed: %d %q %v", resp.StatusCode, line, err)
	}
	start := time.Now()
	x.q.Close()
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("shutdown took %s with a follower", took)
	}
	if rest, _ := io.ReadAll(br); len(rest) != 0 {
		t.Errorf("after shutdown the follower got %q", rest)
	}
}
