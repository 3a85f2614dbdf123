package hive

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/lifecycle"
)

// fakeQueen plays the queen's side of the contract and records what it got.
type fakeQueen struct {
	srv   *httptest.Server
	token string

	mu         sync.Mutex
	down       bool // guarded by mu; answer 503 to everything
	known      map[string]bool
	registers  []api.RegisterPool
	heartbeats []api.Heartbeat
	events     []api.WorkerEvent
	badAuth    int
	// eventStatus, when set, answers every event with this status;
	// eventTries counts the events so answered.
	eventStatus int
	eventTries  int
	// wantFull answers unchanged beats with full_wanted; refuseUnchanged
	// answers them 400, as a queen that does not know them does.
	wantFull, refuseUnchanged bool
	// noStreams answers the heartbeat stream 404, as a queen without it
	// does; streams and posts count the heartbeats that came each way.
	noStreams      bool
	streams, posts int
	// held, when set, refuses registrations and heartbeats 409
	// pool_id_in_use with it as the message, as a queen does when
	// another live hive holds the pool id; refusals counts them.
	held     string
	refusals int
	// instances are the hive instances the heartbeats named (the
	// api.HiveInstanceHeader of the stream or the post).
	instances map[string]bool
	change    chan struct{}
	// epoch, when set, is the queen_epoch of full heartbeats' answers.
	epoch int64
}

func newFakeQueen(t testing.TB, token string) *fakeQueen {
	q := &fakeQueen{token: token, known: map[string]bool{}, change: make(chan struct{})}
	q.srv = httptest.NewServer(http.HandlerFunc(q.serve))
	t.Cleanup(q.srv.Close)
	return q
}

func (q *fakeQueen) serve(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/v2/pools/") && strings.HasSuffix(r.URL.Path, "/beats") {
		q.serveBeats(w, r)
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	defer func() { close(q.change); q.change = make(chan struct{}) }()
	if q.down {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+q.token {
		q.badAuth++
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	b, _ := io.ReadAll(r.Body)
	dec := func(v any) bool {
		d := json.NewDecoder(strings.NewReader(string(b)))
		d.DisallowUnknownFields()
		if err := d.Decode(v); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return false
		}
		return true
	}
	switch {
	case r.URL.Path == "/v2/pools/register" && q.held != "":
		q.refusals++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": "pool_id_in_use", "message": q.held}})
	case r.URL.Path == "/v2/pools/register":
		var reg api.RegisterPool
		if dec(&reg) {
			q.registers = append(q.registers, reg)
			q.known[reg.PoolID] = true
			w.WriteHeader(http.StatusOK)
		}
	case strings.HasPrefix(r.URL.Path, "/v2/pools/") && strings.HasSuffix(r.URL.Path, "/heartbeat"):
		id := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v2/pools/"), "/heartbeat")
		q.posts++
		q.sawInstance(r)
		status, answer := q.beat(id, b)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(answer))
	case r.URL.Path == "/v2/internal/workers/events" && q.eventStatus != 0:
		q.eventTries++
		http.Error(w, `{"error":{"code":"invalid_request","message":"refused by the test"}}`, q.eventStatus)
	case r.URL.Path == "/v2/internal/workers/events":
		var ev api.WorkerEvent
		if dec(&ev) {
			q.events = append(q.events, ev)
		}
	default:
		http.NotFound(w, r)
	}
}

// beat takes one heartbeat of pool id (under mu): the status and body of
// the answer.
func (q *fakeQueen) beat(id string, b []byte) (int, string) {
	if q.held != "" {
		q.refusals++
		m, _ := json.Marshal(q.held)
		return http.StatusConflict, `{"error":{"code":"pool_id_in_use","message":` + string(m) + `}}`
	}
	if !q.known[id] {
		return http.StatusNotFound, `{"error":{"code":"pool_not_found","message":"unknown pool"}}`
	}
	var hb api.Heartbeat
	d := json.NewDecoder(strings.NewReader(string(b)))
	d.DisallowUnknownFields()
	switch {
	case d.Decode(&hb) != nil:
		return http.StatusBadRequest, `{"error":{"code":"invalid_request","message":"not a heartbeat"}}`
	case hb.Unchanged && q.refuseUnchanged:
		return http.StatusBadRequest, `{"error":{"code":"invalid_request","message":"json: unknown field \"unchanged\""}}`
	case hb.Unchanged && q.wantFull:
		q.heartbeats = append(q.heartbeats, hb)
		return http.StatusOK, `{"pool_id":"` + id + `","status":"healthy","full_wanted":true}`
	}
	q.heartbeats = append(q.heartbeats, hb)
	if q.epoch > 0 {
		return http.StatusOK, fmt.Sprintf(`{"pool_id":%q,"status":"healthy","queen_epoch":%d}`, id, q.epoch)
	}
	return http.StatusOK, `{"pool_id":"` + id + `","status":"healthy"}`
}

// serveBeats plays the queen's heartbeat stream: one answer line a beat,
// an error as its api.LineError; a queen that goes down ends the stream.
func (q *fakeQueen) serveBeats(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v2/pools/"), "/beats")
	q.mu.Lock()
	down, noStreams, authed := q.down, q.noStreams, r.Header.Get("Authorization") == "Bearer "+q.token
	q.mu.Unlock()
	switch {
	case down:
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	case !authed:
		q.set(func() { q.badAuth++ })
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	case noStreams:
		http.NotFound(w, r)
		return
	}
	q.set(func() { q.sawInstance(r) })
	rc := http.NewResponseController(w)
	_ = rc.EnableFullDuplex()
	w.WriteHeader(http.StatusContinue) // as the queen does: see its postBeats
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()
	lines := bufio.NewScanner(r.Body)
	for lines.Scan() {
		var status int
		var answer string
		q.mu.Lock()
		if !q.down {
			q.streams++
			status, answer = q.beat(id, lines.Bytes())
		}
		close(q.change)
		q.change = make(chan struct{})
		q.mu.Unlock()
		if status == 0 { // went down
			return
		}
		if status != http.StatusOK {
			answer = fmt.Sprintf(`{"error":%s,"status":%d}`, strings.TrimSuffix(strings.TrimPrefix(answer, `{"error":`), "}"), status)
		}
		if _, err := w.Write([]byte(answer + "\n")); err != nil || rc.Flush() != nil {
			return
		}
	}
}

// sawInstance records the hive instance r names (under mu).
func (q *fakeQueen) sawInstance(r *http.Request) {
	if q.instances == nil {
		q.instances = map[string]bool{}
	}
	q.instances[r.Header.Get(api.HiveInstanceHeader)] = true
}

// until waits for cond (checked under the lock) to hold.
func (q *fakeQueen) until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		q.mu.Lock()
		ok := cond()
		ch := q.change
		q.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("queen never saw %s", what)
		}
	}
}

func (q *fakeQueen) waitEvent(t testing.TB, id string, to lifecycle.State) api.WorkerEvent {
	t.Helper()
	var got api.WorkerEvent
	q.until(t, "event "+id+" → "+string(to), func() bool {
		for _, ev := range q.events {
			if (id == "" || ev.WorkerID == id) && ev.To == string(to) {
				got = ev
				return true
			}
		}
		return false
	})
	return got
}

func (q *fakeQueen) set(fn func()) {
	q.mu.Lock()
	defer q.mu.Unlock()
	fn()
}

func withQueen(q *fakeQueen) hiveOpt {
	return func(c *Config) { c.QueenURL = q.srv.URL; c.ClusterToken = q.token }
}

func TestQueenRegisterHeartbeatEvents(t *testing.T) {
	q := newFakeQueen(t, "cluster-token")
	th := startHive(t, withQueen(q))
	q.until(t, "a registration", func() bool { return len(q.registers) == 1 })
	reg := q.registers[0]
	if reg.PoolID != "pool-test" || reg.Endpoint != th.URL() || reg.Version == "" || len(reg.GPUs) != 1 || reg.NodeID == "" {
		t.Errorf("register = %+v", reg)
	}
	id := th.startAuthed("cluster-token")
	q.waitEvent(t, id, lifecycle.Starting)
	ready := q.waitEvent(t, id, lifecycle.Ready)
	if ready.PoolID != "pool-test" || ready.From != "starting" || ready.Worker.URI == "" || ready.Worker.PID == 0 {
		t.Errorf("ready event = %+v", ready)
	}
	q.until(t, "a heartbeat with the ready worker", func() bool {
		for _, hb := range q.heartbeats {
			if len(hb.Workers) == 1 && hb.Workers[0].Status == "ready" && len(hb.GPUs) == 1 {
				return true
			}
		}
		return false
	})
	q.set(func() {
		if q.streams == 0 || q.posts != 0 {
			t.Errorf("%d heartbeats on the stream and %d posted; want all on the stream", q.streams, q.posts)
		}
	})
	th.Shutdown()
	// The last transitions of a cascade still reach the queen.
	q.waitEvent(t, id, lifecycle.Draining)
	q.waitEvent(t, id, lifecycle.Stopped)
	q.set(func() {
		if q.badAuth != 0 {
			t.Errorf("%d requests without the cluster token", q.badAuth)
		}
	})
}

func TestQueenAwayThenBackReregisters(t *testing.T) {
	q := newFakeQueen(t, "tok")
	q.set(func() { q.down = true })
	th := startHive(t, withQueen(q))
	// Standalone while the queen is away: workers still start and run.
	id := th.startAuthed("tok")
	th.rec.wait(t, id, lifecycle.Ready)
	q.set(func() { q.down = false })
	q.until(t, "a registration after coming back", func() bool { return len(q.registers) == 1 })
	// Events held back while it was away are delivered, in order.
	q.waitEvent(t, id, lifecycle.Ready)
	q.set(func() {
		var seen []string
		for _, ev := range q.events {
			if ev.WorkerID == id {
				seen = append(seen, ev.To)
			}
		}
		if !slicesEqual(seen[:2], []string{"starting", "ready"}) {
			t.Errorf("events = %v", seen)
		}
	})
	// The queen restarts and forgets the pool: heartbeats get 404 and the
	// hive registers again.
	q.set(func() { q.known = map[string]bool{} })
	q.until(t, "a second registration", func() bool { return len(q.registers) >= 2 })
	q.until(t, "heartbeats after re-registering", func() bool { return len(q.heartbeats) > 0 && q.known["pool-test"] })
}

// A queen that refuses the hive because another live hive holds its pool
// id (409 pool_id_in_use) is not a passing fault: the hive says so at
// once, as an error naming the pool id, the queen's reason and
// --pool-id, not again at each retry, keeps serving standalone and
// registering again every heartbeat interval, and registers when the
// holder is gone. Its registration and heartbeats name its instance. A
// hive whose heartbeats are refused so (it was taken over) registers
// again, and says so again.
func TestQueenRefusesAHeldPoolID(t *testing.T) {
	const held = `pool id "pool-test" is held by the hive at http://127.0.0.1:1 (node "other"), which is alive; start this hive with its own --pool-id`
	q := newFakeQueen(t, "tok")
	q.set(func() { q.held = held })
	th := startHive(t, withQueen(q))
	q.until(t, "three refused registrations", func() bool { return q.refusals >= 3 })
	id := th.startAuthed("tok") // standalone meanwhile
	th.rec.wait(t, id, lifecycle.Ready)
	const said = "the queen refuses this hive: another live hive holds its pool id"
	if n := strings.Count(th.logs.String(), said); n != 1 {
		t.Errorf("the refusal logged %d times in %d refusals, want once:\n%s", n, q.refusals, th.logs.String())
	}
	for _, want := range []string{"level=ERROR", "pool_id=pool-test", "--pool-id", `http://127.0.0.1:1`} {
		if line := grepLine(th.logs.String(), said); !strings.Contains(line, want) {
			t.Errorf("the refusal's log line lacks %s: %s", want, line)
		}
	}

	q.set(func() { q.held = "" })
	q.until(t, "a registration once the holder is gone", func() bool { return len(q.registers) == 1 })
	q.until(t, "a heartbeat", func() bool { return len(q.heartbeats) > 0 })
	q.set(func() {
		inst := q.registers[0].Instance
		if len(inst) != 16 || len(q.instances) != 1 || !q.instances[inst] {
			t.Errorf("registered as instance %q; heartbeats named %v", inst, q.instances)
		}
	})

	// Taken over: its heartbeats are refused, and it registers again.
	q.set(func() { q.held, q.refusals = held, 0 })
	q.until(t, "a refused registration after a refused heartbeat", func() bool { return q.refusals >= 2 })
	q.until(t, "the second refusal logged", func() bool { return strings.Count(th.logs.String(), said) == 2 })
}

// grepLine is the first line of text that contains s.
func grepLine(text, s string) string {
	for line := range strings.Lines(text) {
		if strings.Contains(line, s) {
			return line
		}
	}
	return ""
}

// startAuthed starts a worker with the cluster token.
func (th *testHive) startAuthed(token string) string {
	th.t.Helper()
	req, _ := http.NewRequest("POST", th.url+"/v2/workers/start", strings.NewReader(`{"model_ref":"tiny"}`))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		th.t.Fatal(err)
	}
	defer resp.Body.Close()
	var res api.StartWorkerResponse
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil || resp.StatusCode != http.StatusAccepted {
		th.t.Fatalf("start: %d %v", resp.StatusCode, err)
	}
	return res.WorkerID
}

// Heartbeats and events carry no history (the time bomb: it grew
// with every busy/ready change and was sent in every heartbeat), only the
// count of transitions; the hive's own API still shows the recent history.
// Each heartbeat carries the live workers' own tokens for the queen.
func TestQueenMessagesDoNotGrowWithAWorkersAge(t *testing.T) {
	q := newFakeQueen(t, "cluster-token")
	th := startHive(t, withQueen(q))
	id := th.startAuthed("cluster-token")
	ready := q.waitEvent(t, id, lifecycle.Ready)
	if ready.Worker.History != nil || ready.Worker.Transitions != 1 || ready.WorkerToken == "" {
		t.Errorf("ready event: history %v, transitions %d, token set %v", ready.Worker.History, ready.Worker.Transitions, ready.WorkerToken != "")
	}
	q.until(t, "a heartbeat with the ready worker", func() bool {
		for _, hb := range q.heartbeats {
			if len(hb.Workers) == 1 && hb.Workers[0].Status == "ready" {
				if hb.Workers[0].History != nil || hb.Workers[0].Transitions < 1 || hb.WorkerTokens[id] == "" {
					t.Errorf("heartbeat worker %+v, tokens for %v", hb.Workers[0], len(hb.WorkerTokens))
				}
				return true
			}
		}
		return false
	})
	req, _ := http.NewRequest("GET", th.url+"/v2/workers/"+id, nil)
	req.Header.Set("Authorization", "Bearer cluster-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var w api.Worker
	if err := json.NewDecoder(resp.Body).Decode(&w); err != nil || len(w.History) != 1 || w.History[0].To != "ready" {
		t.Errorf("GET /v2/workers/%s: %v, history %+v", id, err, w.History)
	}
}

// An event the queen refuses (4xx) used to be retried forever,
// holding back every later event while the hive re-registered each
// interval. Now it is dropped after one try; one that fails with a 5xx is
// retried a bounded number of times; the events behind them get through;
// the hive does not re-register.
func TestRefusedEventsAreDroppedNotRetried(t *testing.T) {
	q := newFakeQueen(t, "cluster-token")
	q.set(func() { q.eventStatus = http.StatusBadRequest })
	th := startHive(t, withQueen(q), func(c *Config) { c.HeartbeatInterval = 50 * time.Millisecond })
	id := th.startAuthed("cluster-token")
	th.rec.wait(t, id, lifecycle.Ready)
	q.until(t, "both events refused", func() bool { return q.eventTries >= 2 })
	q.set(func() { q.eventStatus = http.StatusServiceUnavailable })
	var stop api.StopWorkerResponse
	if code := th.doAuthed("POST", "/v2/workers/"+id+"/stop", api.StopWorkerRequest{}, &stop, "cluster-token"); code != http.StatusAccepted {
		t.Fatalf("stop: %d", code)
	}
	// draining and stopped fail with 503: each is tried maxEventAttempts
	// times, then dropped. Had the two refused ones been retried, the
	// count would pass this.
	q.until(t, "the 503s given up", func() bool { return q.eventTries >= 2+2*maxEventAttempts })
	q.set(func() {
		if q.eventTries != 2+2*maxEventAttempts {
			t.Errorf("%d tries, want 2 refused once each and 2 failing %d times each", q.eventTries, maxEventAttempts)
		}
	})
	q.set(func() { q.eventStatus = 0 })
	id2 := th.startAuthed("cluster-token")
	q.waitEvent(t, id2, lifecycle.Ready)
	q.set(func() {
		if len(q.registers) != 1 {
			t.Errorf("%d registrations, want 1", len(q.registers))
		}
	})
}

// After a full heartbeat the queen took, the hive sends unchanged beats
// until something the queen acts on changes; a queen that asks for the
// full heartbeat gets it at once, and one that refuses unchanged beats
// gets full ones from then on.
func TestQueenUnchangedBeats(t *testing.T) {
	q := newFakeQueen(t, "tok")
	th := startHive(t, withQueen(q), func(c *Config) { c.HeartbeatInterval = 5 * time.Millisecond })
	kinds := func(from int) (full, unchanged int) {
		for _, hb := range q.heartbeats[from:] {
			if hb.Unchanged {
				unchanged++
			} else {
				full++
			}
		}
		return
	}
	q.until(t, "unchanged beats after the first full one", func() bool {
		full, unchanged := kinds(0)
		return full >= 1 && unchanged >= 3
	})
	q.set(func() {
		if q.heartbeats[0].Unchanged || len(q.heartbeats[0].GPUs) != 1 {
			t.Errorf("first heartbeat %+v, want the full inventory", q.heartbeats[0])
		}
		for _, hb := range q.heartbeats {
			if hb.Unchanged && (len(hb.GPUs) > 0 || len(hb.Workers) > 0 || len(hb.WorkerTokens) > 0) {
				t.Errorf("an unchanged beat carries %+v", hb)
			}
		}
	})

	// A worker starts: the next beats carry it whole, then go quiet again.
	var mark int
	q.set(func() { mark = len(q.heartbeats) })
	id := th.startAuthed("tok")
	th.rec.wait(t, id, lifecycle.Ready)
	q.until(t, "a full heartbeat with the ready worker, then unchanged ones", func() bool {
		seen := -1
		for i, hb := range q.heartbeats[mark:] {
			if !hb.Unchanged && len(hb.Workers) == 1 && hb.Workers[0].Status == "ready" && hb.WorkerTokens[id] != "" {
				seen = i
			}
		}
		if seen < 0 {
			return false
		}
		_, unchanged := kinds(mark + seen)
		return unchanged >= 2
	})

	// The queen asks for the full heartbeat: each unchanged beat is
	// followed at once by the full one.
	q.set(func() { q.wantFull, mark = true, len(q.heartbeats) })
	q.until(t, "full heartbeats after each refused unchanged beat", func() bool {
		hbs := q.heartbeats[mark:]
		n := 0
		for i := 0; i+1 < len(hbs); i++ {
			if hbs[i].Unchanged && !hbs[i+1].Unchanged && len(hbs[i+1].Workers) == 1 {
				n++
			}
		}
		return n >= 2
	})

	// A queen that refuses unchanged beats: full ones only, from then on.
	q.set(func() { q.wantFull, q.refuseUnchanged = false, true })
	q.until(t, "full heartbeats only", func() bool {
		hbs := q.heartbeats
		last := len(hbs) - 1
		for last >= 0 && !hbs[last].Unchanged {
			last--
		}
		return len(hbs)-1-last >= 5
	})
	q.set(func() { q.refuseUnchanged, mark = false, len(q.heartbeats) })
	q.until(t, "more full heartbeats", func() bool { return len(q.heartbeats) >= mark+5 })
	q.set(func() {
		if _, unchanged := kinds(mark); unchanged > 0 {
			t.Errorf("%d unchanged beats after the queen refused them", unchanged)
		}
	})
}

// A queen without the heartbeat stream (404 to it) gets one POST a
// heartbeat, full and unchanged ones alike.
func TestQueenWithoutStreamGetsPosts(t *testing.T) {
	q := newFakeQueen(t, "tok")
	q.set(func() { q.noStreams = true })
	startHive(t, withQueen(q))
	q.until(t, "a full heartbeat, then unchanged ones, posted", func() bool {
		return q.posts >= 3 && len(q.heartbeats) >= 3 && !q.heartbeats[0].Unchanged && q.heartbeats[len(q.heartbeats)-1].Unchanged
	})
	q.set(func() {
		if q.streams != 0 {
			t.Errorf("%d heartbeats on a stream the queen does not have", q.streams)
		}
	})
}

// A hive started before its queen (nothing listens at --queen yet) tries
// again soon, then less often: it registers within a second or so of the
// queen serving, not at its next heartbeat (10 s here, the default).
func TestHiveStartedBeforeItsQueenRegistersSoonAfterIt(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there until the queen starts
	q := newFakeQueen(t, "tok")
	srv := &http.Server{Handler: http.HandlerFunc(q.serve)}
	t.Cleanup(func() { srv.Close() }) // after the hive has stopped (cleanups run last first)
	startHive(t, func(c *Config) {
		c.QueenURL = "http://" + addr
		c.ClusterToken = "tok"
		c.HeartbeatInterval = 10 * time.Second
	})
	time.Sleep(600 * time.Millisecond) // a few tries against no queen
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	up := time.Now()
	q.until(t, "a registration", func() bool { return len(q.registers) == 1 })
	if took := time.Since(up); took > 5*time.Second {
		t.Errorf("registered %s after the queen served, with a heartbeat interval of 10s", took)
	}
}

// A standby names the active queen (api.ActiveQueenHeader): the hive goes
// there, not to the next queen of its list.
func TestHiveFollowsTheActiveTheStandbyNames(t *testing.T) {
	next, active := newFakeQueen(t, "tok"), newFakeQueen(t, "tok")
	standby := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(api.ActiveQueenHeader, active.srv.URL+"/")
		w.Header().Set("Retry-After", "1")
		api.WriteJSON(w, http.StatusServiceUnavailable, map[string]any{"error": map[string]string{
			"code": "standby", "message": "this queen is a standby: another queen holds the database"}})
	}))
	t.Cleanup(standby.Close)
	startHive(t, func(c *Config) {
		c.QueenURL, c.ClusterToken = standby.URL+","+next.srv.URL+","+active.srv.URL, "tok"
	})
	active.until(t, "a registration", func() bool { return len(active.registers) == 1 })
	next.set(func() {
		if len(next.registers)+next.posts+next.streams != 0 {
			t.Errorf("the queen after the standby in the list got %d registrations and %d heartbeats; want none",
				len(next.registers), next.posts+next.streams)
		}
	})
}
