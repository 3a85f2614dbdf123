package hive

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/testhub"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// A hive's pull (POST /v2/models/pull, as the queen asks for one) whose
// download stops coming while the connection stays open hung for ever;
// after --pull-stall-timeout without a byte it is now resumed from where
// it was, and the hive's log says so.
func TestPullResumesAStalledDownload(t *testing.T) {
	var tiny bytes.Buffer
	if err := testmodel.Write(&tiny, testmodel.Options{Seed: 5}); err != nil {
		t.Fatal(err)
	}
	hub := testhub.New(t, "org/tiny-GGUF", map[string][]byte{"tiny-Q4_K_M.gguf": tiny.Bytes()})
	hub.StallAfter("tiny-Q4_K_M.gguf", 1000)
	th := startHive(t, func(c *Config) { c.PullStallTimeout = 200 * time.Millisecond })
	var pull api.ModelPull
	if code := th.do("POST", "/v2/models/pull", api.PullModelRequest{Ref: "hf://org/tiny-GGUF:Q4_K_M"}, &pull); code != http.StatusAccepted {
		t.Fatalf("POST /v2/models/pull: %d %+v", code, pull)
	}
	deadline := time.Now().Add(waitLimit)
	for pull.State == api.PullRunning && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		th.do("GET", "/v2/models/pulls/"+pull.ID, nil, &pull)
	}
	if pull.State != api.PullDone {
		t.Fatalf("pull %+v\nhive log:\n%s", pull, th.logs.String())
	}
	if got, _ := os.ReadFile(filepath.Join(th.cfg.ModelsDir, "tiny-Q4_K_M.gguf")); !bytes.Equal(got, tiny.Bytes()) {
		t.Error("the pulled file differs from the Hub's")
	}
	if !strings.Contains(th.logs.String(), `msg="model pull resuming: no bytes for 200ms; resuming at 1000 bytes"`) {
		t.Errorf("the hive's log does not say the pull stalled and resumed:\n%s", th.logs.String())
	}
	if n := hub.Served.Load(); n != int64(tiny.Len()) {
		t.Errorf("the Hub served %d bytes, want %d: resumed, not restarted", n, tiny.Len())
	}
}
