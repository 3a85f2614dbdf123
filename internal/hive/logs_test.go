package hive

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
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
	// The ring holds 4..12; the head comes from the file.
	if b, dropped, end := l.head(100); string(b) != "0123456789ab" || dropped != 0 || end != 12 {
		t.Fatalf("head of the file: %q dropped %d end %d", b, dropped, end)
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

// logWithin reads worker id's log through the API until it holds s, up
// to waitLimit; it returns the last log read and whether it held s.
func (th *testHive) logWithin(id, s string) (string, bool) {
	th.t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		_, log := th.getLogs(id, "")
		if strings.Contains(log, s) || time.Now().After(deadline) {
			return log, strings.Contains(log, s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitForLog waits until l's ring holds s (woken by each write, up to
// waitLimit).
func waitForLog(t *testing.T, l *workerLog, s string) {
	t.Helper()
	limit := time.After(waitLimit)
	for {
		_, _, _, grew, _ := l.since(math.MaxInt64)
		if strings.Contains(string(l.Bytes()), s) {
			return
		}
		select {
		case <-grew:
		case <-limit:
			t.Fatalf("the log has no %q:\n%s", s, l.Bytes())
		}
	}
}

// GET /v2/workers/{id}/logs: the worker's output, its last N lines, a
// follower that gets new lines and ends with the worker, and an old
// worker's file; bad queries are refused.
func TestWorkerLogsTailFollowAndFile(t *testing.T) {
	th := startHive(t)
	id := th.start()
	th.rec.wait(t, id, lifecycle.Ready)
	wk, _ := th.reg.get(id, false)
	// The worker's line comes through a pipe, maybe after its callback:
	// the test's lines go after it.
	waitForLog(t, wk.out, "fake worker "+id+" listening")
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

// lines is "line 01\n" to "line <to>\n" from line from on, 8 bytes each.
func lines(from, to int) string {
	var b strings.Builder
	for i := from; i <= to; i++ {
		fmt.Fprintf(&b, "line %02d\n", i)
	}
	return b.String()
}

// serveLog is streamLog's answer to q for l (q without Follow, or l ended).
func serveLog(t *testing.T, l *workerLog, q api.LogQuery) string {
	t.Helper()
	rec := httptest.NewRecorder()
	streamLog(t.Context(), rec, l, q)
	return rec.Body.String()
}

// readOrAbsent is the file at p, or "(absent)".
func readOrAbsent(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return "(absent)"
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A write that would take the file past the cap renames it to .log.1,
// over the older one, and starts a new .log whose header says where in
// the log it starts; a write larger than the cap gets a file to itself.
func TestWorkerLogRotatesAtTheCap(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "worker-r.log")
	l := newWorkerLog(p)
	l.maxFile = 10
	hdr := func(at int) string { return fmt.Sprintf(rotatedHeader, "worker-r.log", at) }
	big := strings.Repeat("x", 24) + "\n"
	for _, step := range []struct {
		write, log, log1 string
	}{
		{"12345\n", "12345\n", "(absent)"},
		{"abcdef\n", hdr(6) + "abcdef\n", "12345\n"},
		{"xy\n", hdr(6) + "abcdef\nxy\n", "12345\n"}, // 10 bytes: at the cap, not past it
		{"z\n", hdr(16) + "z\n", hdr(6) + "abcdef\nxy\n"},
		{big, hdr(18) + big, hdr(16) + "z\n"},
		{"after\n", hdr(43) + "after\n", hdr(18) + big},
	} {
		_, _ = l.Write([]byte(step.write))
		if got := readOrAbsent(t, p); got != step.log {
			t.Errorf("after %q: .log %q, want %q", step.write, got, step.log)
		}
		if got := readOrAbsent(t, p+".1"); got != step.log1 {
			t.Errorf("after %q: .log.1 %q, want %q", step.write, got, step.log1)
		}
	}
	l.close()
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("%d files in the logs dir, want .log and .log.1", len(entries))
	}
}

// A worker that logs without end does not fill the disk: after many
// rotations it has two files, each within the cap (and its header), and
// between them exactly the most recent output, at least a cap of it.
func TestWorkerLogDiskIsBounded(t *testing.T) {
	const capBytes = 1000
	dir := t.TempDir()
	p := filepath.Join(dir, "worker-chatty.log")
	l := newWorkerLog(p)
	l.maxFile = capBytes
	var all bytes.Buffer
	for i := range 5000 {
		line := fmt.Sprintf("%d %s\n", i, strings.Repeat("y", i%40))
		all.WriteString(line)
		_, _ = l.Write([]byte(line))
	}
	l.close()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var disk int64
	for _, e := range entries {
		info, _ := e.Info()
		disk += info.Size()
		if max := int64(capBytes + len(rotatedHeader) + 20); info.Size() > max {
			t.Errorf("%s: %d bytes, more than the cap and a header (%d)", e.Name(), info.Size(), max)
		}
	}
	if len(entries) != 2 {
		t.Errorf("files %v, want worker-chatty.log and its .1", entries)
	}
	t.Logf("%d bytes written, %d on disk", all.Len(), disk)

	// What the files hold: the log's last bytes, without a gap.
	prev, err := fileSegment(p + ".1")
	if err != nil {
		t.Fatal(err)
	}
	cur, err := fileSegment(p)
	if err != nil {
		t.Fatal(err)
	}
	if prev.to != cur.from || cur.to != int64(all.Len()) || cur.to-prev.from < capBytes-41 {
		t.Fatalf("segments %+v %+v of a %d-byte log", prev, cur, all.Len())
	}
	want := all.Bytes()[prev.from:]
	b, dropped, end := endedLog(p).head(1 << 20)
	if !bytes.Equal(b, want) || dropped != prev.from || end != int64(all.Len()) {
		t.Errorf("the files hold %d bytes (dropped %d, end %d), want the last %d of %d", len(b), dropped, end, len(want), all.Len())
	}
	if got, want := l.Tail(1), strings.TrimSpace(all.String()[strings.LastIndex(strings.TrimSpace(all.String()), "\n")+1:]); got != want {
		t.Errorf("the ring's last line %q, want %q", got, want)
	}
}

// Across rotations the answers are the log's most recent bytes from both
// files, with no gap or duplicate: all of it after a line saying how much
// is gone, a tail, the last MiB from a line's start, and a follower that
// goes on through a rotation.
func TestWorkerLogsAcrossARotation(t *testing.T) {
	l := newWorkerLog(filepath.Join(t.TempDir(), "w.log"))
	l.size = 16 // the ring holds 2 lines; the answers come from the files
	l.maxFile = 40
	_, _ = l.Write([]byte(lines(1, 20))[:100]) // one write larger than the cap: a file of its own
	_, _ = l.Write([]byte(lines(1, 20))[100:]) // rotates
	_, _ = l.Write([]byte(lines(21, 21)))      // rotates: .log.1 holds 100..160, from the middle of line 13
	_, _ = l.Write([]byte(lines(22, 22)))
	want := "[apiary: the first 100 bytes of this log are no longer kept]\n" + lines(1, 20)[100:] + lines(21, 22)
	for _, tc := range []struct {
		q    api.LogQuery
		want string
	}{
		{api.LogQuery{}, want},
		{api.LogQuery{Tail: 2}, lines(21, 22)},
		{api.LogQuery{Tail: 3}, lines(20, 22)}, // from both files
		{api.LogQuery{Tail: 9}, lines(14, 22)},
		{api.LogQuery{Tail: 100}, want},
	} {
		if got := serveLog(t, l, tc.q); got != tc.want {
			t.Errorf("tail %d: %q, want %q", tc.q.Tail, got, tc.want)
		}
	}

	// Follow: the tail, then what comes, through the next rotation.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		streamLog(r.Context(), w, l, api.LogQuery{Tail: 2, Follow: true})
	}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for i := 21; i <= 27; i++ {
		if i > 22 {
			_, _ = l.Write([]byte(lines(i, i))) // line 26 rotates
		}
		if got, err := br.ReadString('\n'); got != lines(i, i) {
			t.Fatalf("followed %q (%v), want %q", got, err, lines(i, i))
		}
	}
	l.close()
	if rest, _ := io.ReadAll(br); len(rest) != 0 {
		t.Errorf("after the end: %q", rest)
	}
	if got, want := serveLog(t, l, api.LogQuery{}), "[apiary: the first 160 bytes of this log are no longer kept]\n"+lines(21, 27); got != want {
		t.Errorf("after the follow: %q, want %q", got, want)
	}
}

// The first MiB before the end, when the files hold more, is cut at a
// line's start, one file's end included, and says nothing is gone.
func TestWorkerLogsLastMiBAcrossARotation(t *testing.T) {
	l := newWorkerLog(filepath.Join(t.TempDir(), "w.log"))
	l.maxFile = 800 << 10
	line := strings.Repeat("z", 99) + "\n"
	var all strings.Builder
	for i := range (2 << 20) / len(line) {
		s := fmt.Sprintf("%07d", i) + line[7:]
		all.WriteString(s)
		_, _ = l.Write([]byte(s))
	}
	full := all.String()
	n := api.MaxLogBytes / len(line) // whole lines in a MiB
	want := full[len(full)-n*len(line):]
	if got := serveLog(t, l, api.LogQuery{}); got != want {
		t.Errorf("the last MiB: %d bytes from %q, want %d from %q", len(got), got[:min(20, len(got))], len(want), want[:20])
	}
	if _, err := os.Stat(l.path + ".1"); err != nil {
		t.Errorf("no rotated file: %v", err)
	}
	v := l.view()
	if df, ok := v.diskFrom(); !ok || df > int64(len(full)-api.MaxLogBytes) || v.cur.from < int64(len(full)-api.MaxLogBytes) {
		t.Errorf("the answer does not span both files: %+v", v)
	}
}

// A reader that opens the files after they were rotated under the view it
// took does not read the new ones as the old (it tries again).
func TestWorkerLogReadDetectsARotation(t *testing.T) {
	l := newWorkerLog(filepath.Join(t.TempDir(), "w.log"))
	l.maxFile = 16
	_, _ = l.Write([]byte(lines(1, 2)))
	v := l.view()
	_, _ = l.Write([]byte(lines(3, 3)))
	if _, err := l.readFiles(v, 0); !errors.Is(err, errRotated) {
		t.Fatalf("read under an old view: %v, want errRotated", err)
	}
	if b, dropped, _ := l.head(100); string(b) != lines(1, 3) || dropped != 0 {
		t.Errorf("head %q dropped %d", b, dropped)
	}
	v.gen++ // a rotation under way
	if _, ok := v.diskFrom(); ok {
		t.Error("the files are trusted while they are renamed")
	}
}

// Readers that run while the writer rotates the files again and again
// always get the log's last bytes up to the end they name: never a file
// read as another.
func TestWorkerLogReadersDuringRotations(t *testing.T) {
	l := newWorkerLog(filepath.Join(t.TempDir(), "w.log"))
	l.size = 64
	l.maxFile = 200
	var stream strings.Builder
	for i := range 3000 {
		fmt.Fprintf(&stream, "%d\n", i)
	}
	all := stream.String()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < len(all); i += 7 {
			_, _ = l.Write([]byte(all[i:min(i+7, len(all))]))
		}
	}()
	for reads := 0; ; reads++ {
		select {
		case <-done:
			t.Logf("%d reads", reads)
			return
		default:
		}
		b, dropped, end := l.head(1 << 20)
		if want := all[end-int64(len(b)) : end]; string(b) != want || dropped != end-int64(len(b)) {
			t.Fatalf("read %d: %q (dropped %d) is not the %d bytes before %d: %q", reads, b, dropped, len(b), end, want)
		}
	}
}

// A log whose files cannot be written (a full disk, no logs dir, a
// rotation that cannot rename) takes every write without an error and is
// answered from the ring, saying how much of it is gone.
func TestWorkerLogWithoutItsFiles(t *testing.T) {
	for _, tc := range []struct {
		name string
		path func(dir string) string
	}{
		{"full disk", func(string) string { return "/dev/full" }},
		{"no logs dir", func(dir string) string { return filepath.Join(dir, "gone", "w.log") }},
		{"rotation fails", func(dir string) string {
			// .log.1 a directory that is not empty: the rename fails.
			if err := os.MkdirAll(filepath.Join(dir, "w.log.1", "x"), 0o755); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(dir, "w.log")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newWorkerLog(tc.path(t.TempDir()))
			l.size = 24
			l.maxFile = 20
			for i := 1; i <= 6; i++ {
				if n, err := l.Write([]byte(lines(i, i))); n != 8 || err != nil {
					t.Fatalf("write: %d %v", n, err)
				}
			}
			want := "[apiary: the first 24 bytes of this log are no longer kept]\n" + lines(4, 6)
			if got := serveLog(t, l, api.LogQuery{}); got != want {
				t.Errorf("log %q, want %q", got, want)
			}
			l.close()
		})
	}
}

// After a restart the hive serves an ended worker's log from its files: a
// rotated log from both, or from the one that is left, each saying how
// much of the log is gone. (An older hive's single file, without a
// header: TestWorkerLogsTailFollowAndFile.)
func TestEndedLogAfterRotation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		remove string
		want   string
		tail2  string
	}{
		{"both files", "", "[apiary: the first 80 bytes of this log are no longer kept]\n" + lines(11, 20), lines(19, 20)},
		{"without .log", "w.log", "[apiary: the first 80 bytes of this log are no longer kept]\n" + lines(11, 15), lines(14, 15)},
		{"without .log.1", "w.log.1", "[apiary: the first 120 bytes of this log are no longer kept]\n" + lines(16, 20), lines(19, 20)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "w.log")
			l := newWorkerLog(p)
			l.maxFile = 40
			for i := 1; i <= 20; i++ {
				_, _ = l.Write([]byte(lines(i, i)))
			}
			l.close()
			if tc.remove != "" {
				if err := os.Remove(filepath.Join(dir, tc.remove)); err != nil {
					t.Fatal(err)
				}
			}
			e := endedLog(p)
			if e == nil {
				t.Fatal("no ended log")
			}
			if got := serveLog(t, e, api.LogQuery{Follow: true}); got != tc.want {
				t.Errorf("ended log %q, want %q", got, tc.want)
			}
			if got := serveLog(t, e, api.LogQuery{Tail: 2}); got != tc.tail2 {
				t.Errorf("tail 2: %q, want %q", got, tc.tail2)
			}
		})
	}
	if endedLog(filepath.Join(t.TempDir(), "none.log")) != nil {
		t.Error("an ended log without files")
	}
}
