package queen

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/rpc"
	"github.com/apiary-llm/apiary/internal/transport"
)

// openBeats opens pool id's heartbeat stream on x with token.
func openBeats(t *testing.T, x *tq, id, token string) (*rpc.Stream, error) {
	t.Helper()
	// A client that waits for "100 Continue" before it sends its body
	// (the hive's waits not at all: it only races the answer's head) sees
	// at once a queen that answers without it.
	tr := transport.NewTransport()
	tr.ExpectContinueTimeout = time.Minute
	hc := transport.NewClient(tr, 0)
	t.Cleanup(hc.CloseIdleConnections)
	s, err := rpc.OpenStream(context.Background(), hc, rpc.Call{URL: x.url + "/v2/pools/" + id + "/beats", Token: token}, waitLimit)
	if err == nil {
		t.Cleanup(s.Close)
	}
	return s, err
}

func statusOf(err error) int {
	var se *rpc.StatusError
	if errors.As(err, &se) {
		return se.Status
	}
	return 0
}

// Each beat on the stream is answered as POST …/heartbeat answers it, in
// order; a refused beat is answered alone (its status in the line) and
// the stream goes on; a line over the body limit is answered 413 and
// ends the stream.
func TestHeartbeatStream(t *testing.T) {
	tokens := Tokens{API: "api-t-0123456789", Admin: "admin-t-0123456789", Cluster: "cluster-t-0123456789"}
	x := startQueen(t, sqliteDir(t), "", func(c *Config) { c.Tokens = tokens; c.MaxBodyBytes = 4096 })

	// A refusal comes at once, not after the time limit: the queen does
	// not wait for the end of a body that has none.
	for _, token := range []string{"", tokens.Admin} {
		start := time.Now()
		_, err := openBeats(t, x, "a", token)
		if statusOf(err) != http.StatusUnauthorized {
			t.Fatalf("stream with token %q: %v, want 401", token, err)
		}
		if took := time.Since(start); took > waitLimit/2 {
			t.Errorf("the 401 took %s", took)
		}
	}
	if _, err := openBeats(t, x, "no%20such", tokens.Cluster); statusOf(err) != http.StatusBadRequest {
		t.Fatalf("stream of an invalid pool id: %v, want 400", err)
	}

	s, err := openBeats(t, x, "a", tokens.Cluster)
	if err != nil {
		t.Fatal(err)
	}
	var ans api.HeartbeatAnswer
	full := api.Heartbeat{GPUs: []api.GPU{{ID: 0, Kind: "cpu", TotalBytes: 8 << 30, FreeBytes: 4 << 30}}, Workers: []api.Worker{}}
	// Not registered yet: 404, as the hive's POST gets; the hive registers
	// and beats on the same stream.
	if err := s.Round(full, &ans, waitLimit); statusOf(err) != http.StatusNotFound {
		t.Fatalf("beat of an unknown pool: %v, want 404", err)
	}
	x.register("a")
	if err := s.Round(full, &ans, waitLimit); err != nil || ans.PoolID != "a" || ans.Status != "healthy" {
		t.Fatalf("full beat: %+v, %v", ans, err)
	}
	for range 3 {
		ans = api.HeartbeatAnswer{}
		if err := s.Round(api.Heartbeat{Unchanged: true}, &ans, waitLimit); err != nil || ans.Status != "healthy" || ans.FullWanted {
			t.Fatalf("unchanged beat: %+v, %v", ans, err)
		}
	}
	bad := api.Heartbeat{GPUs: []api.GPU{{ID: -1, Kind: "cpu"}}}
	if err := s.Round(bad, &ans, waitLimit); statusOf(err) != http.StatusBadRequest || !strings.Contains(err.Error(), "negative") {
		t.Fatalf("beat with a negative gpu id: %v, want 400 naming it", err)
	}
	if err := s.Round(api.Heartbeat{Unchanged: true}, &ans, waitLimit); err != nil || ans.Status != "healthy" {
		t.Fatalf("unchanged beat after a refused one: %+v, %v", ans, err)
	}
	if n := x.pool("a"); n.Status != "healthy" || n.LastHeartbeatAt == nil {
		t.Errorf("pool after the stream's beats: %+v", n)
	}
	huge := api.Heartbeat{GPUs: []api.GPU{{ID: 0, Kind: "cpu", Name: strings.Repeat("x", 5000)}}}
	if err := s.Round(huge, &ans, waitLimit); statusOf(err) != http.StatusRequestEntityTooLarge {
		t.Fatalf("a 5 KB beat with a 4 KB limit: %v, want 413", err)
	}
	if err := s.Round(api.Heartbeat{Unchanged: true}, &ans, waitLimit); !errors.Is(err, rpc.ErrUnreachable) {
		t.Fatalf("beat after the 413: %v, want the stream ended", err)
	}
}

// A stream with no beat for the heartbeat timeout ends, and a queen that
// shuts down ends every stream without waiting for them.
func TestHeartbeatStreamEnds(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "", func(c *Config) { c.HeartbeatTimeout = 300 * time.Millisecond })
	x.register("a")
	if _, err := openBeats(t, x, "a", ""); err != nil {
		t.Fatal(err)
	}
	x.logs.wait(t, 0, "heartbeat stream ended: no beat within the heartbeat timeout", map[string]string{"pool_id": "a"})

	y := startQueen(t, sqliteDir(t), "")
	y.register("a")
	s, err := openBeats(t, y, "a", "")
	if err != nil {
		t.Fatal(err)
	}
	var ans api.HeartbeatAnswer
	if err := s.Round(api.Heartbeat{GPUs: []api.GPU{}, Workers: []api.Worker{}}, &ans, waitLimit); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- y.q.Close() }()
	select {
	case <-closed:
	case <-time.After(waitLimit):
		t.Fatal("the queen did not stop with a heartbeat stream open")
	}
	if err := s.Round(api.Heartbeat{Unchanged: true}, &ans, waitLimit); !errors.Is(err, rpc.ErrUnreachable) {
		t.Fatalf("beat after the queen stopped: %v, want the stream ended", err)
	}
}

// A full beat that repeats the last one leaves its arrays to the next
// beat of the stream: a beat decoded into them has only its own fields,
// none of the one before (its omitted fields are not carried over).
func TestHeartbeatStreamReusesNothingStale(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	x.register("a")
	s, err := openBeats(t, x, "a", "")
	if err != nil {
		t.Fatal(err)
	}
	temp := 70
	hot := api.Heartbeat{GPUs: []api.GPU{{ID: 0, Kind: "cpu", TotalBytes: 8 << 30, FreeBytes: 4 << 30, UUID: "GPU-1", TemperatureC: &temp,
		Unusable: "too hot", Workers: []string{}}}, Workers: []api.Worker{}}
	cool := api.Heartbeat{GPUs: []api.GPU{{ID: 0, Kind: "cpu", TotalBytes: 8 << 30, FreeBytes: 4 << 30, Workers: []string{}}}, Workers: []api.Worker{}}
	for i, hb := range []api.Heartbeat{hot, hot, cool} {
		var ans api.HeartbeatAnswer
		if err := s.Round(hb, &ans, waitLimit); err != nil || ans.Status != "healthy" {
			t.Fatalf("beat %d: %+v, %v", i, ans, err)
		}
	}
	if g := x.pool("a").GPUs; len(g) != 1 || g[0].TemperatureC != nil || g[0].UUID != "" || g[0].Unusable != "" {
		t.Fatalf("devices after a beat without temperature, uuid and unusable: %+v", g)
	}
}

// A queen that stepped down (it lost the database's lock) answers as a
// standby at once, while it still stops the hives it started: /health
// 503 standby, and the next beat of an open heartbeat stream 503 standby,
// which ends the stream, so that a hive that follows the queens moves to
// the next one. (A regression: the stepped-down queen took the beats of
// an operator's hive while it stopped its own, and the new active wrote
// that hive's worker off as lost and stopped it.)
func TestSteppedDownQueenAnswersAsAStandby(t *testing.T) {
	x := startQueen(t, sqliteDir(t), "")
	x.register("a")
	s, err := openBeats(t, x, "a", "")
	if err != nil {
		t.Fatal(err)
	}
	var ans api.HeartbeatAnswer
	if err := s.Round(api.Heartbeat{GPUs: []api.GPU{}, Workers: []api.Worker{}}, &ans, waitLimit); err != nil {
		t.Fatal(err)
	}
	if status, body := x.do("GET", "/health/live", "", nil); status != http.StatusOK || !strings.Contains(string(body), `"role":"active"`) {
		t.Errorf("/health/live of the active queen: %d %s, want 200 active", status, body)
	}
	x.q.steppedDown.Store(true)
	var se *rpc.StatusError
	if err := s.Round(api.Heartbeat{Unchanged: true}, &ans, waitLimit); !errors.As(err, &se) || se.Status != http.StatusServiceUnavailable || se.Code != "standby" {
		t.Fatalf("beat after the step-down: %v, want 503 standby", err)
	}
	if err := s.Round(api.Heartbeat{Unchanged: true}, &ans, waitLimit); !errors.Is(err, rpc.ErrUnreachable) {
		t.Fatalf("beat after the refusal: %v, want the stream ended", err)
	}
	status, body := x.do("GET", "/health", "", nil)
	if status != http.StatusServiceUnavailable || !strings.Contains(string(body), `"standby"`) {
		t.Errorf("/health after the step-down: %d %s, want 503 standby", status, body)
	}
	// A watchdog's liveness check stays 200: the process answers.
	if status, body := x.do("GET", "/health/live", "", nil); status != http.StatusOK || !strings.Contains(string(body), `"role":"standby"`) {
		t.Errorf("/health/live after the step-down: %d %s, want 200 standby", status, body)
	}
	status, body = x.do("POST", "/v2/pools/a/heartbeat", "", api.Heartbeat{Unchanged: true})
	if status != http.StatusServiceUnavailable || !strings.Contains(string(body), `"standby"`) {
		t.Errorf("POST heartbeat after the step-down: %d %s, want 503 standby", status, body)
	}
}
