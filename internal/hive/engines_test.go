package hive

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
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
// misbehaviours; its child, if any, writes its pid to childPID.
func withEngine(t testing.TB, mode, childPID string) hiveOpt {
	bin := testbin.FakeEngine(t)
	return func(c *Config) {
		c.Engines = map[string]Engine{"fake": {Command: []string{bin, "-host", "{host}", "-port", "{port}", "-model", "{model}",
			"-mode", mode, "-child-pid", childPID}}}
	}
}

// startEngine starts a worker of model tiny on engine fake.
func (th *testHive) startEngine() string {
	th.t.Helper()
	var res api.StartWorkerResponse
	if code := th.do("POST", "/v2/workers/start", api.StartWorkerRequest{ModelRef: "tiny", Engine: "fake"}, &res); code != http.StatusAccepted {
		th.t.Fatalf("start: %d", code)
	}
	return res.WorkerID
}

func TestEngineBecomesReadyServesAndStops(t *testing.T) {
	th := startHive(t, withEngine(t, "", ""))
	id := th.startEngine()
	ready := th.rec.wait(t, id, lifecycle.Ready)
	if !strings.Contains(ready.Reason, "/health answered 200") {
		t.Errorf("ready reason = %q", ready.Reason)
	}
	if ready.WorkerToken != "" {
		t.Errorf("an engine without {api_key} got a token: %q", ready.WorkerToken)
	}
	if w := th.worker(id); w.VRAMBytes == 0 {
		t.Errorf("ready engine holds no memory: %+v", w)
	}
	resp, err := http.Post(ready.Worker.URI+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"tiny","messages":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	var answer struct {
		ReceivedBody string `json:"received_body"`
	}
	err = json.NewDecoder(resp.Body).Decode(&answer)
	resp.Body.Close()
	if err != nil || answer.ReceivedBody != `{"model":"tiny","messages":[]}` {
		t.Fatalf("answer %+v, %v", answer, err)
	}
	if code := th.do("POST", "/v2/workers/"+id+"/stop", api.StopWorkerRequest{}, nil); code != http.StatusAccepted {
		t.Fatalf("stop: %d", code)
	}
	stopped := th.rec.wait(t, id, lifecycle.Stopped)
	if !strings.Contains(stopped.Reason, "forced stop") {
		t.Errorf("stopped reason = %q (an engine is stopped by SIGTERM)", stopped.Reason)
	}
	th.gone(id)
	portFree(t, ready.Worker.URI)
}

func TestEngineNeverHealthyFailsAtTheStartTimeoutWithItsOutput(t *testing.T) {
	th := startHive(t, withEngine(t, "never-healthy", ""), func(c *Config) { c.CallbackTimeout = time.Second })
	id := th.startEngine()
	failed := th.rec.wait(t, id, lifecycle.Failed)
	for _, w := range []string{"/health did not answer 200 within 1s", "fakeengine: serving"} {
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

func TestEngineIgnoringSIGTERMIsKilled(t *testing.T) {
	th := startHive(t, withEngine(t, "ignore-term", ""))
	id := th.startEngine()
	th.rec.wait(t, id, lifecycle.Ready)
	th.do("POST", "/v2/workers/"+id+"/stop", api.StopWorkerRequest{}, nil)
	stopped := th.rec.wait(t, id, lifecycle.Stopped)
	if !strings.Contains(stopped.Reason, "killed by signal 9") {
		t.Errorf("stopped reason = %q, want SIGKILL", stopped.Reason)
	}
	if !strings.Contains(th.logs.String(), "worker ignored SIGTERM; sending SIGKILL") {
		t.Errorf("no SIGKILL escalation logged")
	}
	th.gone(id)
}

func TestEngineChildDiesWithItsGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	th := startHive(t, withEngine(t, "fork-child", pidFile))
	id := th.startEngine()
	th.rec.wait(t, id, lifecycle.Ready)
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	child, err := strconv.Atoi(string(b))
	if err != nil {
		t.Fatal(err)
	}
	th.do("POST", "/v2/workers/"+id+"/stop", api.StopWorkerRequest{}, nil)
	th.rec.wait(t, id, lifecycle.Stopped)
	th.gone(id)
	if s, err := procs.ReadStat(child); err == nil && s.Alive() {
		t.Errorf("the engine's child %d outlived it", child)
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

func TestEngineWithAPIKeyGetsAToken(t *testing.T) {
	th := startHive(t, withEngine(t, "", ""), func(c *Config) {
		e := c.Engines["fake"]
		e.Env = map[string]string{"FAKE_ENGINE_KEY": "{api_key}"}
		c.Engines["fake"] = e
	})
	id := th.startEngine()
	ready := th.rec.wait(t, id, lifecycle.Ready)
	if len(ready.WorkerToken) != 64 {
		t.Errorf("an engine with {api_key} has token %q; the queen sends it as the bearer", ready.WorkerToken)
	}
	_, tokens := th.reg.heartbeat()
	if tokens[id] != ready.WorkerToken {
		t.Errorf("heartbeat token %q, event token %q", tokens[id], ready.WorkerToken)
	}
}
