package queen

import (
	"context"
	"database/sql"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/store"
)

// The lifecycle rows were once locked across their store writes, and
// every request reads them; a store that stalls (a SQLite busy wait, a hung
// PostgreSQL) stopped all routing. Now a row write that waits for the
// store holds back only the other row writes: requests are still routed
// and answered meanwhile.
func TestRoutingDoesNotWaitForAStalledStore(t *testing.T) {
	worker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"text_completion","choices":[{"text":"hi","index":0,"finish_reason":"length"}]}`)
	}))
	defer worker.Close()
	dir := sqliteDir(t)
	x, _ := routeQueen(t, map[string][]api.Model{"http://hive-a": {tinyModel}}, func(c *Config) { c.DataDir = dir })
	x.registerAt("a", "http://hive-a")
	x.readyWorker("a", worker.URL)
	other := x.start("tiny", "a") // a STARTING row that a hive event will change

	// Another connection takes SQLite's write lock: the queen's next write
	// waits for it (its busy timeout).
	db, err := sql.Open("sqlite", filepath.Join(dir, store.SQLiteFile))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The queen may be writing right now (a flush): retry until the lock
	// is this connection's.
	for deadline := time.Now().Add(waitLimit); ; {
		_, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE")
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "SQLITE_BUSY") || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	released := false
	release := func() {
		if !released {
			released = true
			_, _ = conn.ExecContext(context.Background(), "ROLLBACK")
		}
	}
	defer release()

	// A hive event that changes a row: its write now waits for the store.
	evDone := make(chan struct{})
	go func() {
		defer close(evDone)
		now := time.Now().UTC()
		x.do("POST", "/v2/internal/workers/events", "", api.WorkerEvent{PoolID: "a", WorkerID: other.Worker.WorkerID,
			LifecycleID: other.LifecycleID, From: "starting", To: "failed", Reason: "test", At: now,
			Worker: api.Worker{WorkerID: other.Worker.WorkerID, LifecycleID: other.LifecycleID, ModelRef: "tiny", Status: "failed", StartedAt: now}})
	}()
	// Wait until the event's write holds the writers' lock (it then waits
	// for the store, for up to its busy timeout).
	deadline := time.Now().Add(waitLimit)
	for x.q.rows.wmu.TryLock() {
		x.q.rows.wmu.Unlock()
		select {
		case <-evDone:
			t.Fatal("the event's write did not wait for the store: the test holds no lock")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the event never reached its row write")
		}
		runtime.Gosched()
	}
	// Requests are routed while that write waits.
	for range 3 {
		status, body := x.do("POST", "/v1/completions", "", `{"model":"tiny","prompt":"hi","max_tokens":2}`)
		if status != http.StatusOK {
			t.Fatalf("request while the store stalls: %d %s", status, body)
		}
	}
	select {
	case <-evDone:
		t.Fatal("the store was released before the requests were answered; the test proves nothing")
	default:
	}
	release()
	<-evDone
	if r := x.row(other.LifecycleID); r.Status != "FAILED" {
		t.Errorf("the event's row after the store came back: %+v", r)
	}
}
