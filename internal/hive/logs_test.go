package hive

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/lifecycle"
)

func TestLastLines(t *testing.T) {
	for _, tc := range []struct {
		in   string
		cut  bool
		n    int
		want string
	}{
		{"a\nb\nc\n", false, 2, "b\nc\n"},
		{"a\nb\nc", false, 2, "b\nc"},
		{"a\nb\nc\n", false, 0, "a\nb\nc\n"},
		{"a\nb\nc\n", false, 9, "a\nb\nc\n"},
		{"rt of a\nb\n", true, 0, "b\n"},
		{"no newline at all", true, 0, ""},
		{"", false, 3, ""},
	} {
		if got := string(lastLines([]byte(tc.in), tc.cut, tc.n)); got != tc.want {
			t.Errorf("lastLines(%q, %v, %d) = %q, want %q", tc.in, tc.cut, tc.n, got, tc.want)
		}
	}
}

// A follower gets every write from where it stands, learns how much the
// ring lost when it fell behind, and is told when the log ends.
func TestWorkerLogSince(t *testing.T) {
	l := newWorkerLog(filepath.Join(t.TempDir(), "w.log"))
	l.size = 8
	_, _ = l.Write([]byte("0123"))
	data, lost, next, grew, ended := l.since(0)
	if string(data) != "0123" || lost != 0 || next != 4 || ended {
		t.Fatalf("since(0) = %q %d %d %v", data, lost, next, ended)
	}
	_, _ = l.Write([]byte("456789ab"))
	select {
	case <-grew:
	default:
		t.Fatal("a write did not wake the follower")
	}
	data, lost, next, grew, _ = l.since(next)
	if string(data) != "456789ab" || lost != 0 || next != 12 {
		t.Fatalf("since(4) = %q %d %d", data, lost, next)
	}
	data, lost, _, _, _ = l.since(2) // behind the ring, which holds 4..12
	if string(data) != "456789ab" || lost != 2 {
		t.Fatalf("since(2) = %q lost %d", data, lost)
	}
	l.close()
	select {
	case <-grew:
	default:
		t.Fatal("close did not wake the follower")
	}
	if data, _, _, _, ended := l.since(next); len(data) != 0 || !ended {
		t.Fatalf("after close: %q ended=%v", data, ended)
	}
	head, cut, err := l.head(12, 5)
	if err != nil || string(head) != "789ab" || !cut {
		t.Fatalf("head of the file: %q %v %v", head, cut, err)
	}
}

// getLogs asks the hive for a worker's logs.
func (th *testHive) getLogs(id, query string) (int, string) {
	th.t.Helper()
	resp, err := http.Get(th.url + "/v2/workers/" + id + "/logs" + query)
	if err != nil {
		th.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// GET /v2/workers/{id}/logs: the worker's output, its last N lines, a
// follower that gets new lines and ends with the worker, and an old
// worker's file; bad queries are refused.
func TestWorkerLogsTailFollowAndFile(t *testing.T) {
	th := startHive(t)
	id := th.start()
	th.rec.wait(t, id, lifecycle.Ready)
	wk, _ := th.reg.get(id, false)
	_, _ = wk.out.Write([]byte("line one\nline two\n"))

	if code, body := th.getLogs(id, ""); code != 200 || !strings.Contains(body, "fake worker "+id+" listening") || !strings.HasSuffix(body, "line one\nline two\n") {
		t.Errorf("logs: %d %q", code, body)
	}
	if code, body := th.getLogs(id, "?tail=1"); code != 200 || body != "line two\n" {
		t.Errorf("tail=1: %d %q", code, body)
	}
	for _, q := range []string{"?tail=0", "?tail=-1", "?tail=10001", "?tail=x", "?follow=maybe"} {
		if code, body := th.getLogs(id, q); code != 400 || !strings.Contains(body, "invalid_request") {
			t.Errorf("%s: %d %s, want 400", q, code, body)
		}
	}

	// Follow: the tail, then a new line as it is written, then the end
	// when the worker stops.
	resp, err := http.Get(th.url + "/v2/workers/" + id + "/logs?tail=1&follow=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	next := func() (string, bool) {
		select {
		case l, ok := <-lines:
			return l, ok
		case <-time.After(waitLimit):
			t.Fatal("no line from the follower")
			return "", false
		}
	}
	if l, _ := next(); l != "line two" {
		t.Fatalf("first followed line %q, want the tail", l)
	}
	_, _ = wk.out.Write([]byte("line three\n"))
	if l, _ := next(); l != "line three" {
		t.Fatalf("followed line %q, want line three", l)
	}
	if code := th.do("POST", "/v2/workers/"+id+"/stop", "{}", nil); code != http.StatusAccepted {
		t.Fatalf("stop: %d", code)
	}
	for {
		if _, ok := next(); !ok {
			break // the stream ended with the worker
		}
	}
	th.gone(id)

	// An ended worker's log, and a worker's file from an earlier run
	// (follow ends at once: nothing more comes).
	if code, body := th.getLogs(id, "?tail=1"); code != 200 || body == "" {
		t.Errorf("ended worker's tail: %d %q", code, body)
	}
	old := "worker-0ld"
	if err := os.WriteFile(filepath.Join(th.data.logsDir(), old+".log"), []byte("from before\nlast words"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, body := th.getLogs(old, "?follow=1"); code != 200 || body != "from before\nlast words" {
		t.Errorf("old worker's log: %d %q", code, body)
	}
	if code, body := th.getLogs(old, "?tail=1"); code != 200 || body != "last words\n" {
		t.Errorf("old worker's tail: %d %q", code, body)
	}
	var e api.Error
	if code := th.do("GET", "/v2/workers/worker-gone/logs", nil, &e); code != 404 || e.Error.Code != "worker_not_found" || !strings.Contains(e.Error.Message, "no log file") {
		t.Errorf("unknown worker's log: %d %+v", code, e)
	}
}

// Once a worker's log file is full (maxLogFile) the file no longer holds
// the log's offsets: the answer comes from the ring, without the file's
// closing note and without a gap.
func TestWorkerLogsServeTheRingPastAFullFile(t *testing.T) {
	l := newWorkerLog(filepath.Join(t.TempDir(), "w.log"))
	l.maxFile = 10
	_, _ = l.Write([]byte("12345\n"))
	_, _ = l.Write([]byte("abcdef\n"))
	l.close()
	rec := httptest.NewRecorder()
	streamLog(t.Context(), rec, l, api.LogQuery{Follow: true})
	if got := rec.Body.String(); got != "12345\nabcdef\n" {
		t.Errorf("log past a full file: %q", got)
	}
	rec = httptest.NewRecorder()
	streamLog(t.Context(), rec, l, api.LogQuery{Tail: 1})
	if got := rec.Body.String(); got != "abcdef\n" {
		t.Errorf("tail past a full file: %q", got)
	}
}
