//go:build !race

package queen

// A real `apiary queen` taking batch input files as large as its
// defaults allow (#32): its memory stays bounded, and the database stays
// open to other writes while the batches are created.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// writeLargeBatchFile writes a batch input file of n chat requests of
// lineBytes each (newline included) and returns its path.
func writeLargeBatchFile(t *testing.T, n, lineBytes int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "large.jsonl")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	for i := range n {
		head := fmt.Sprintf(`{"custom_id":"req-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"tiny","max_tokens":8,"messages":[{"role":"user","content":"`, i)
		tail := `"}]}}` + "\n"
		w.WriteString(head)
		w.WriteString(strings.Repeat("x", lineBytes-len(head)-len(tail)))
		w.WriteString(tail)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// uploadPath streams the file at path to POST /v1/files and returns the
// file's id.
func uploadPath(t *testing.T, base, path string) string {
	t.Helper()
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		err := mw.WriteField("purpose", "batch")
		var part io.Writer
		if err == nil {
			part, err = mw.CreateFormFile("file", filepath.Base(path))
		}
		if err == nil {
			var f *os.File
			if f, err = os.Open(path); err == nil {
				_, err = io.Copy(part, f)
				f.Close()
			}
		}
		if err == nil {
			err = mw.Close()
		}
		pw.CloseWithError(err)
	}()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/files", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out struct {
		ID string `json:"id"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(data, &out) != nil || out.ID == "" {
		t.Fatalf("upload: %d %s", resp.StatusCode, data)
	}
	return out.ID
}

// procMemMiB reads a memory figure of /proc/<pid>/status (VmHWM: the
// peak resident set; VmRSS: the resident set now), in MiB.
func procMemMiB(t testing.TB, pid int, field string) float64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(l, field+":"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				t.Fatalf("/proc/%d/status %s: %v", pid, field, err)
			}
			return kb / 1024
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, field)
	return 0
}

// A 100 MB input file (50 000 requests of 2 000 bytes: within the
// defaults of --batch-max-file-bytes, --batch-max-lines and
// --max-body-bytes) is uploaded to a real queen, on SQLite (the file in
// its data dir) and on PostgreSQL (the file in the database, 1 MiB
// chunks), read back whole, and made four batches at once, with admin
// writes sent all along: every creation and every admin write succeeds,
// and the queen's peak resident memory (VmHWM) stays under 300 MiB.
// (Before #32's fix the file was read whole and its jobs written in one
// transaction: four creations at once peaked at 1.49 GB, two answered
// 500 SQLITE_BUSY, admin writes beside them failed "database is
// locked".)
func TestProcessBatchLargeFileMemory(t *testing.T) {
	const n, lineBytes, creations = 50000, 2000, 4
	path := writeLargeBatchFile(t, n, lineBytes)
	eachBackend(t, func(t *testing.T, be backend) {
		dir, url := be.new(t)
		largeFileMemory(t, path, n, lineBytes, creations, dir, url)
	})
}

func largeFileMemory(t *testing.T, path string, n, lineBytes, creations int, dir, url string) {
	if dir == "" {
		dir = t.TempDir() // uploads being checked
	}
	q, base := startQueenProc(t, dir, url, "--data-dir", dir)
	pid := q.cmd.Process.Pid
	startRSS := procMemMiB(t, pid, "VmRSS")

	began := time.Now()
	fileID := uploadPath(t, base, path)
	uploaded := time.Since(began)
	began = time.Now()
	resp, err := http.Get(base + "/v1/files/" + fileID + "/content")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || err != nil || got != int64(n*lineBytes) {
		t.Fatalf("the file read back: %d, %d bytes of %d, %v", resp.StatusCode, got, n*lineBytes, err)
	}
	readBack := time.Since(began)
	afterUpload := procMemMiB(t, pid, "VmHWM")

	stop := make(chan struct{})
	var writers sync.WaitGroup
	var mu sync.Mutex
	var writeErrs []string
	writes, slowest := 0, time.Duration(0)
	writers.Go(func() {
		hc := &http.Client{Timeout: waitLimit}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			req, _ := http.NewRequest(http.MethodPut, base+"/api/admin/models/tiny", strings.NewReader(fmt.Sprintf(`{"min_workers":0,"reason":"write %d"}`, i)))
			req.Header.Set("Content-Type", "application/json")
			at := time.Now()
			resp, err := hc.Do(req)
			took := time.Since(at)
			mu.Lock()
			writes++
			slowest = max(slowest, took)
			if err != nil {
				writeErrs = append(writeErrs, err.Error())
			} else {
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					writeErrs = append(writeErrs, fmt.Sprintf("%d %s", resp.StatusCode, data))
				}
			}
			mu.Unlock()
		}
	})
	began = time.Now()
	var creators sync.WaitGroup
	answers := make([]string, creations)
	for i := range creations {
		creators.Go(func() {
			body := fmt.Sprintf(`{"input_file_id":%q,"endpoint":"/v1/chat/completions","completion_window":"24h"}`, fileID)
			resp, err := http.Post(base+"/v1/batches", "application/json", strings.NewReader(body))
			if err != nil {
				answers[i] = err.Error()
				return
			}
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			answers[i] = fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(data))
		})
	}
	creators.Wait()
	created := time.Since(began)
	close(stop)
	writers.Wait()
	peak := procMemMiB(t, pid, "VmHWM")
	for i, a := range answers {
		if !strings.HasPrefix(a, "200 ") || !strings.Contains(a, fmt.Sprintf(`"total":%d`, n)) {
			t.Errorf("creation %d: %.300s", i, a)
		}
	}
	for _, e := range writeErrs {
		t.Errorf("an admin write beside the creations: %s", e)
	}
	t.Logf("queen RSS at start %.0f MiB; upload of %d bytes %s, read back %s, peak after them %.0f MiB; %d creations at once %s, peak %.0f MiB; %d admin writes beside them, the slowest %s",
		startRSS, int64(n*lineBytes), uploaded.Round(time.Millisecond), readBack.Round(time.Millisecond), afterUpload, creations, created.Round(time.Millisecond),
		peak, writes, slowest.Round(time.Millisecond))
	if peak >= 300 {
		t.Errorf("the queen's peak resident memory was %.0f MiB, want under 300", peak)
	}
}
