package hive

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/lifecycle"
	"github.com/apiary-llm/apiary/internal/procs"
	"github.com/apiary-llm/apiary/internal/testbin"
)

func TestLoadEnginesRefusesBadFilesNamingThePath(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []string // each in the error
	}{
		{"unknown key", "engines:\n  x:\n    command: [a]\n    cmd: [b]\n", []string{"field cmd not found"}},
		{"empty command", "engines:\n  x:\n    health: /h\n", []string{"engines.x.command is empty"}},
		{"unknown placeholder", "engines:\n  x:\n    command: [a, '--m={modle}']\n    env: {K: '{prot}'}\n",
			[]string{`engines.x.command[1] unknown placeholder "modle"`, `engines.x.env.K unknown placeholder "prot"`}},
		{"builtin redeclared", "engines:\n  builtin:\n    command: [a]\n", []string{`engines.builtin "builtin" is the built-in engine`}},
		{"health not a path", "engines:\n  x:\n    command: [a]\n    health: health\n", []string{`engines.x.health "health" must be a path`}},
		// The front passes the engine its env by name: a list of names.
		{"env name not a name", "engines:\n  x:\n    command: [a]\n    env: {'A,B': x, 'C D': y, 'E*': z}\n",
			[]string{`engines.x.env "A,B" is not a variable name`, `engines.x.env "C D" is not a variable name`, `engines.x.env "E*" is not a variable name`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "engines.yaml")
			if err := os.WriteFile(path, []byte(tc.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := LoadEngines(path)
			if err == nil {
				t.Fatal("loaded")
			}
			for _, w := range append(tc.want, path) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestLoadEnginesReadsAGoodFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "engines.yaml")
	yaml := "engines:\n  llama:\n    command: [llama-server, -m, '{model}', --port, '{port}']\n    env: {CUDA_VISIBLE_DEVICES: '{gpu}'}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := LoadEngines(path)
	if err != nil {
		t.Fatal(err)
	}
	e := got["llama"]
	if len(e.Command) != 5 || e.Env["CUDA_VISIBLE_DEVICES"] != "{gpu}" || e.healthPath() != "/health" {
		t.Errorf("engine = %+v", e)
	}
}

// withEngine declares engine "fake": the fake engine with mode's
// misbehaviours behind the real apiary engine-front; its child, if any,
// writes its pid to childPID.
func withEngine(t testing.TB, mode, childPID string) hiveOpt {
	bin := testbin.FakeEngine(t)
	front := apiaryBin(t)
	return func(c *Config) {
		c.FrontPath = front
		c.Engines = map[string]Engine{"fake": {Command: []string{bin, "-host", "{host}", "-port", "{port}", "-model", "{model}",
			"-mode", mode, "-child-pid", childPID}}}
	}
}

// startEngine starts a worker of model tiny on engine fake.
func (th *testHive) startEngine() string {
	th.t.Helper()
	return th.startOn("fake")
}

// startOn starts a worker of model tiny on engine.
func (th *testHive) startOn(engine string) string {
	th.t.Helper()
	var res api.StartWorkerResponse
	if code := th.do("POST", "/v2/workers/start", api.StartWorkerRequest{ModelRef: "tiny", Engine: engine}, &res); code != http.StatusAccepted {
		th.t.Fatalf("start: %d", code)
	}
	return res.WorkerID
}

// engineAnswer is the fake engine's chat answer.
type engineAnswer struct {
	Choices []struct {
		Message struct{ Content string } `json:"message"`
	} `json:"choices"`
	ReceivedBody string `json:"received_body"`
	ReceivedAuth string `json:"received_authorization"`
}

// chat posts body to a worker's chat completions with its token.
func chat(uri, token, body string) (engineAnswer, int, error) {
	var a engineAnswer
	req, err := http.NewRequest(http.MethodPost, uri+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return a, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return a, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return a, resp.StatusCode, fmt.Errorf("chat: %d %s", resp.StatusCode, b)
	}
	return a, resp.StatusCode, json.NewDecoder(resp.Body).Decode(&a)
}

// workerLog is worker id's log: its front's lines and the engine's output.
func (th *testHive) workerLog(id string) string {
	b, _ := os.ReadFile(filepath.Join(th.data.logsDir(), id+".log"))
	return string(b)
}

func TestEngineBecomesReadyServesAndStops(t *testing.T) {
	th := startHive(t, withEngine(t, "", ""))
	id := th.startEngine()
	ready := th.rec.wait(t, id, lifecycle.Ready)
	if !strings.Contains(ready.Reason, "ready callback") {
		t.Errorf("ready reason = %q", ready.Reason)
	}
	if len(ready.WorkerToken) != 64 {
		t.Errorf("an engine's worker has token %q; its front checks it as a built-in worker does", ready.WorkerToken)
	}
	if w := th.worker(id); w.VRAMBytes == 0 {
		t.Errorf("ready engine holds no memory: %+v", w)
	}
	if _, code, _ := chat(ready.Worker.URI, "", `{"model":"tiny","messages":[]}`); code != http.StatusUnauthorized {
		t.Errorf("a request without the worker's token: %d, want 401", code)
	}
	answer, _, err := chat(ready.Worker.URI, ready.WorkerToken, `{"model":"tiny","messages":[]}`)
	if err != nil || answer.ReceivedBody != `{"model":"tiny","messages":[]}` {
		t.Fatalf("answer %+v, %v", answer, err)
	}
	if answer.ReceivedAuth != "" {
		t.Errorf("an engine without {api_key} received the bearer %q", answer.ReceivedAuth)
	}
	if code := th.do("POST", "/v2/workers/"+id+"/stop", api.StopWorkerRequest{}, nil); code != http.StatusAccepted {
		t.Fatalf("stop: %d", code)
	}
	stopped := th.rec.wait(t, id, lifecycle.Stopped)
	if !strings.Contains(stopped.Reason, "graceful stop: exit code 0") {
		t.Errorf("stopped reason = %q (the front stops its engine and exits)", stopped.Reason)
	}
	th.gone(id)
	portFree(t, ready.Worker.URI)
	if log := th.workerLog(id); !strings.Contains(log, "engine stopped") || !strings.Contains(log, "stop=graceful") {
		t.Errorf("the worker log does not say how the engine stopped:\n%s", log)
	}
}

func TestEngineNeverHealthyFailsAtTheStartTimeoutWithItsOutput(t *testing.T) {
	th := startHive(t, withEngine(t, "never-healthy", ""), func(c *Config) { c.CallbackTimeout = time.Second })
	id := th.startEngine()
	failed := th.rec.wait(t, id, lifecycle.Failed)
	// The reason names the health URL and ends with the engine's last
	// lines of output.
	for _, w := range []string{"/health did not answer 200 within 1s", "last output:", "fakeengine: serving"} {
		if !strings.Contains(failed.Reason, w) {
			t.Errorf("failed reason %q lacks %q", failed.Reason, w)
		}
	}
	th.gone(id)
}

func TestEngineExitingAtOnceFails(t *testing.T) {
	th := startHive(t, withEngine(t, "exit", ""))
	id := th.startEngine()
	failed := th.rec.wait(t, id, lifecycle.Failed)
	if !strings.Contains(failed.Reason, "process exited unexpectedly: exit code 3") {
		t.Errorf("failed reason = %q", failed.Reason)
	}
	th.gone(id)
}

// The front stops an engine that ignores SIGTERM with SIGKILL after the
// hive's --shutdown-ack, as the hive stops a worker that ignores it.
func TestEngineIgnoringSIGTERMIsKilled(t *testing.T) {
	th := startHive(t, withEngine(t, "ignore-term", ""))
	id := th.startEngine()
	th.rec.wait(t, id, lifecycle.Ready)
	th.do("POST", "/v2/workers/"+id+"/stop", api.StopWorkerRequest{}, nil)
	th.rec.wait(t, id, lifecycle.Stopped)
	th.gone(id)
	if log := th.workerLog(id); !strings.Contains(log, "stop=forced") || !strings.Contains(log, "killed by signal 9") {
		t.Errorf("the worker log does not say the engine was killed:\n%s", log)
	}
}

func TestEngineChildDiesWithItsGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	th := startHive(t, withEngine(t, "fork-child", pidFile))
	id := th.startEngine()
	th.rec.wait(t, id, lifecycle.Ready)
	// The child writes its pid once it runs, which may be after the
	// engine answered its first health check.
	var child int
	for deadline := time.Now().Add(waitLimit); ; time.Sleep(5 * time.Millisecond) {
		b, err := os.ReadFile(pidFile)
		if err == nil {
			if child, err = strconv.Atoi(string(b)); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the engine's child wrote no pid: %v", err)
		}
	}
	th.do("POST", "/v2/workers/"+id+"/stop", api.StopWorkerRequest{}, nil)
	th.rec.wait(t, id, lifecycle.Stopped)
	th.gone(id)
	if s, err := procs.ReadStat(child); err == nil && s.Alive() {
		t.Errorf("the engine's child %d outlived it", child)
	}
}

// The hive's idle timeout stops an engine's worker as a built-in one: a
// request in flight keeps it, the time since the last one ends it.
func TestEngineIdleTimeout(t *testing.T) {
	th := startHive(t, withEngine(t, "slow=1s", ""), func(c *Config) { c.IdleTimeout = 300 * time.Millisecond })
	id := th.startEngine()
	ready := th.rec.wait(t, id, lifecycle.Ready)
	// The request outlasts the idle timeout three times over.
	if _, _, err := chat(ready.Worker.URI, ready.WorkerToken, `{"messages":[]}`); err != nil {
		t.Fatal(err)
	}
	answered := time.Now()
	if st := th.rec.states(id); slices.Contains(st, "draining") {
		t.Fatalf("stopped while a request was in flight: %v", st)
	}
	if st := th.rec.states(id); !slices.Contains(st, "busy") {
		t.Errorf("never busy while serving: %v", st)
	}
	ev := th.rec.wait(t, id, lifecycle.Draining)
	if !strings.Contains(ev.Reason, "idle for 300ms") {
		t.Errorf("reason = %q", ev.Reason)
	}
	if ev.At.Before(answered) {
		t.Errorf("idle stop at %s, before the request ended at %s", ev.At, answered)
	}
	th.rec.wait(t, id, lifecycle.Stopped)
	th.gone(id)
}

// A drain waits for the requests in flight on an engine, as on a
// built-in worker: the stream ends whole, then the engine stops.
func TestEngineDrainLetsInFlightRequestFinish(t *testing.T) {
	th := startHive(t, withEngine(t, "slow=1s", ""))
	id := th.startEngine()
	ready := th.rec.wait(t, id, lifecycle.Ready)
	done := make(chan error, 1)
	go func() {
		a, _, err := chat(ready.Worker.URI, ready.WorkerToken, `{"messages":[]}`)
		if err == nil && (len(a.Choices) != 1 || a.Choices[0].Message.Content != "fake engine answer") {
			err = fmt.Errorf("answer %+v", a)
		}
		done <- err
	}()
	if draining := th.drainBusy(id, done); draining.Reason != "drain requested" {
		t.Errorf("draining reason = %q", draining.Reason)
	}
}

// An engine whose health path answers 200 and 503 in turn degrades on
// each miss and recovers on each answer; with fewer misses in a row than
// --health-failures it is never failed.
func TestEngineHealthFlapping(t *testing.T) {
	th := startHive(t, withEngine(t, "flap", ""), func(c *Config) { c.HealthFailures = 2 })
	id := th.startEngine()
	th.rec.wait(t, id, lifecycle.Ready)
	deadline := time.After(waitLimit)
	for {
		st := th.rec.states(id)
		if slices.Contains(st, "failed") {
			t.Fatalf("a flapping engine failed: %v", st)
		}
		if len(st) >= 6 {
			if want := []string{"starting", "ready", "degraded", "ready", "degraded", "ready"}; !slices.Equal(st[:6], want) {
				t.Fatalf("states = %v, want %v first", st, want)
			}
			break
		}
		select {
		case <-deadline:
			t.Fatalf("states %v", st)
		case <-th.rec.changed():
		}
	}
	for _, ev := range th.rec.of(id) {
		if ev.To == string(lifecycle.Degraded) && !strings.Contains(ev.Reason, "engine_unhealthy") {
			t.Errorf("degraded reason %q does not say the engine's health failed", ev.Reason)
		}
	}
}

func TestUnknownEngineRefusedNamingIt(t *testing.T) {
	th := startHive(t, withEngine(t, "", ""))
	var e api.Error
	code := th.do("POST", "/v2/workers/start", api.StartWorkerRequest{ModelRef: "tiny", Engine: "vllm"}, &e)
	if code != http.StatusBadRequest || !strings.Contains(e.Error.Message, `"vllm"`) || e.Error.Code != "unknown_engine" {
		t.Errorf("start on a missing engine: %d %+v", code, e)
	}
	var models api.ModelList
	th.do("GET", "/v2/models", nil, &models)
	if len(models.Models) != 1 || strings.Join(models.Models[0].Engines, ",") != "builtin,fake" {
		t.Errorf("models = %+v", models.Models)
	}
}

// An engine whose command uses {api_key} gets a key of its own, which
// its front sends as the bearer of what it relays; the worker's token
// stays between the queen and the front.
func TestEngineWithAPIKeyGetsItsOwnKey(t *testing.T) {
	th := startHive(t, withEngine(t, "", ""), func(c *Config) {
		e := c.Engines["fake"]
		e.Env = map[string]string{"FAKE_ENGINE_KEY": "{api_key}"}
		c.Engines["fake"] = e
	})
	id := th.startEngine()
	ready := th.rec.wait(t, id, lifecycle.Ready)
	a, _, err := chat(ready.Worker.URI, ready.WorkerToken, `{"messages":[]}`)
	if err != nil {
		t.Fatal(err)
	}
	key, ok := strings.CutPrefix(a.ReceivedAuth, "Bearer ")
	if !ok || len(key) != 64 || key == ready.WorkerToken {
		t.Errorf("the engine received %q; want its own key, not the worker's token", a.ReceivedAuth)
	}
}
