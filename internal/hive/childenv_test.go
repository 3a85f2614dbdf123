package hive

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/lifecycle"
)

// A hive's children (a worker, an engine's front, the engine) get the
// allow-list of its environment and what --pass-env names, never a
// secret: the fixed deny-list of secrets they got before let the
// operator's SSH_AUTH_SOCK, cloud credentials and other programs' tokens
// through to every worker and engine.
func TestChildrenGetTheAllowListAndWhatIsNamed(t *testing.T) {
	for k, v := range map[string]string{
		"SSH_AUTH_SOCK": "/tmp/agent-s3cret.sock", "AWS_SECRET_ACCESS_KEY": "aws-s3cret", "AWS_REGION": "region-s3cret",
		"HUGGING_FACE_HUB_TOKEN": "hub-s3cret", "APIARY_ADMIN_TOKEN": "admin-s3cret-0123456789", "HF_TOKEN": "hf-s3cret",
		"CUDA_VISIBLE_DEVICES": "allowed-0", "LANG": "C.UTF-8",
	} {
		t.Setenv(k, v)
	}
	for _, tc := range []struct {
		name  string
		pass  []string
		named map[string]string // the variables that pass only because they are named
	}{
		{"none named", nil, nil},
		{"named", []string{"HUGGING_FACE_HUB_TOKEN", "AWS_*"},
			map[string]string{"HUGGING_FACE_HUB_TOKEN": "hub-s3cret", "AWS_SECRET_ACCESS_KEY": "aws-s3cret", "AWS_REGION": "region-s3cret"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pidFile := filepath.Join(t.TempDir(), "engine.pid")
			th := startHive(t, withEngine(t, "", ""), func(c *Config) {
				c.PassEnv = tc.pass
				e := c.Engines["fake"]
				e.Command = append(e.Command, "-pid-file", pidFile)
				e.Env = map[string]string{"FAKE_ENGINE_SETTING": "from-the-engines-file", "HF_TOKEN": "from-the-engines-file"}
				c.Engines["fake"] = e
			})
			worker := th.start()
			th.rec.wait(t, worker, lifecycle.Ready)
			engine := th.startEngine()
			th.rec.wait(t, engine, lifecycle.Ready)
			for _, who := range []struct {
				name string
				env  map[string]string
			}{{"worker", environOf(t, th.worker(worker).PID)}, {"engine front", environOf(t, th.worker(engine).PID)}, {"engine", processEnv(t, pidFile)}} {
				want := map[string]string{"CUDA_VISIBLE_DEVICES": "allowed-0", "LANG": "C.UTF-8", "PATH": os.Getenv("PATH")}
				for k, v := range tc.named {
					want[k] = v
				}
				for k, v := range want {
					if got, ok := who.env[k]; !ok || got != v {
						t.Errorf("the %s lacks %s=%s", who.name, k, v)
					}
				}
				for k, v := range who.env {
					if strings.Contains(v, "s3cret") && tc.named[k] != v {
						t.Errorf("the %s has %s=%s, which no one named", who.name, k, v)
					}
				}
				if who.name == "engine" {
					if who.env["FAKE_ENGINE_SETTING"] != "from-the-engines-file" {
						t.Error("the engine lacks the env of its engines file")
					}
					for _, secret := range []string{"HF_TOKEN", "APIARY_WORKER_TOKEN"} {
						if _, ok := who.env[secret]; ok {
							t.Errorf("the engine has the secret %s", secret)
						}
					}
				}
			}
		})
	}
}
