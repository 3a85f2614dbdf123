//go:build !race

package queen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/testbin"
	"github.com/apiary-llm/apiary/internal/testhub"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// `apiary models pull --pool` with a real queen and hive, from a stand-in
// for the Hub (HF_ENDPOINT): the hive pulls, the CLI follows the pull to
// its end, the model is in the pool's list (`models ls --all`), the queen
// audited the start and the end, and a request for the model is served
// by a worker on that pool. An unknown quantization is refused at once
// with the repository's list.
func TestModelsPullOnAPool(t *testing.T) {
	var q4, q8 bytes.Buffer
	if err := testmodel.Write(&q4, testmodel.Options{Seed: 7}); err != nil {
		t.Fatal(err)
	}
	if err := testmodel.Write(&q8, testmodel.Options{Seed: 8}); err != nil {
		t.Fatal(err)
	}
	hub := testhub.New(t, "org/tiny-GGUF", map[string][]byte{"tiny-Q4_K_M.gguf": q4.Bytes(), "tiny-Q8_0.gguf": q8.Bytes()})
	c := startCluster(t, nil)

	pull := func(args ...string) (int, string, string) {
		p := testbin.Start(t, "apiary models pull", nil, append([]string{"models", "pull", "--queen", c.url}, args...)...)
		code := p.Wait(t)
		return code, p.Stdout(), p.Lines.String()
	}
	code, out, errOut := pull("--pool", "node-1", "--reason", "for the test", "hf://org/tiny-GGUF:q4_k_m")
	if code != 0 || !strings.Contains(out, "pulled tiny-Q4_K_M on pool node-1") {
		t.Fatalf("models pull --pool: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if n := hub.Served.Load(); n != int64(q4.Len()) {
		t.Errorf("the Hub served %d bytes, want %d", n, q4.Len())
	}

	ls := testbin.Start(t, "apiary models ls --all", nil, "models", "ls", "--all", "--json", "--queen", c.url)
	if code := ls.Wait(t); code != 0 {
		t.Fatalf("models ls --all: exit %d: %s", code, ls.Lines.String())
	}
	var list api.PoolModelsList
	if err := json.Unmarshal([]byte(ls.Stdout()), &list); err != nil {
		t.Fatalf("models ls --all --json: %v\n%s", err, ls.Stdout())
	}
	var refs []string
	for _, p := range list.Pools {
		for _, m := range p.Models {
			refs = append(refs, p.PoolID+"/"+m.Ref)
		}
	}
	if strings.Join(refs, " ") != "node-1/tiny node-1/tiny-Q4_K_M" {
		t.Errorf("models ls --all: %v, want node-1/tiny and node-1/tiny-Q4_K_M", refs)
	}

	// The hive reports the end to the queen after the CLI saw it.
	var actions []string
	for deadline := time.Now().Add(waitLimit); ; {
		entries, err := c.admin.Audit(t.Context(), "", 100)
		if err != nil {
			t.Fatal(err)
		}
		actions = actions[:0]
		for _, e := range entries {
			if e.Target == "model:tiny-Q4_K_M" {
				actions = append(actions, e.Action+" by "+e.Actor)
			}
		}
		if len(actions) == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if strings.Join(actions, ", ") != "model.pulled by pool:node-1, model.pull_started by admin" &&
		strings.Join(actions, ", ") != "model.pull_started by admin, model.pulled by pool:node-1" {
		t.Errorf("audit of model:tiny-Q4_K_M: %v, want model.pull_started by admin and model.pulled by pool:node-1", actions)
	}

	params := completion(2)
	params.Model = "tiny-Q4_K_M"
	if s := c.stream(context.Background(), params, nil); s.err != nil || s.tokens != 2 {
		t.Errorf("a request for the pulled model: %+v", s)
	}

	code, _, errOut = pull("--pool", "node-1", "hf://org/tiny-GGUF:Q5_K_S")
	if code == 0 || !strings.Contains(errOut, "no GGUF file of quantization Q5_K_S; available: Q4_K_M (tiny-Q4_K_M.gguf), Q8_0 (tiny-Q8_0.gguf)") {
		t.Errorf("pull of an unknown quantization: exit %d\n%s", code, errOut)
	}
}

// A configured model with a source that no pool has is pulled on demand:
// a request for it by its alias waits while the queen asks the hive to
// pull it from the (stand-in) Hub, then is served by a worker of the
// pulled file; the audit shows the pull started by the queen with the
// request as its reason, and its end.
func TestConfiguredModelPulledOnDemand(t *testing.T) {
	var q4 bytes.Buffer
	if err := testmodel.Write(&q4, testmodel.Options{Seed: 7}); err != nil {
		t.Fatal(err)
	}
	hub := testhub.New(t, "org/tiny-GGUF", map[string][]byte{"tiny-Q4_K_M.gguf": q4.Bytes()})
	cfg := filepath.Join(t.TempDir(), "models.yaml")
	if err := os.WriteFile(cfg, []byte("models:\n  small:\n    source: hf://org/tiny-GGUF:Q4_K_M\n    file: small-q4\n    aliases: [gpt-small]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, []string{"--config", cfg})

	params := completion(2)
	params.Model = "gpt-small"
	if s := c.stream(context.Background(), params, nil); s.err != nil || s.tokens != 2 {
		t.Fatalf("a request for the configured model no pool had: %+v", s)
	}
	if n := hub.Served.Load(); n != int64(q4.Len()) {
		t.Errorf("the Hub served %d bytes, want %d", n, q4.Len())
	}
	entries, err := c.admin.Audit(t.Context(), "", 200)
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, e := range entries {
		if e.Target != "model:small-q4" {
			continue
		}
		actions = append(actions, e.Action+" by "+e.Actor)
		if e.Action == "model.pull_started" && !strings.Contains(e.Reason, "requests for small-q4 waiting") {
			t.Errorf("model.pull_started reason %q does not name the requests that needed it", e.Reason)
		}
	}
	slices.Sort(actions)
	if want := "model.pull_started by queen, model.pulled by pool:node-1"; strings.Join(actions, ", ") != want {
		t.Errorf("audit of model:small-q4: %v, want %s", actions, want)
	}
}

// A configured model whose source is a split GGUF is served as its first
// part's name, which its file must be: file: big-00001-of-00003 is pulled
// (every part, named big-0000i-of-00003) and served; a file that is not
// that name (the default, the model's name) is refused by the hive before
// anything is downloaded, and the request says what to write instead.
func TestConfiguredSplitModelIsServedAsItsFirstPart(t *testing.T) {
	files := map[string][]byte{}
	var size int
	for i := 1; i <= 3; i++ {
		var part bytes.Buffer
		if err := testmodel.Write(&part, testmodel.Options{Seed: int64(i)}); err != nil {
			t.Fatal(err)
		}
		files[fmt.Sprintf("big-Q8_0-%05d-of-00003.gguf", i)] = part.Bytes()
		size += part.Len()
	}
	hub := testhub.New(t, "org/big-GGUF", files)
	cfg := filepath.Join(t.TempDir(), "models.yaml")
	config := "models:\n" +
		"  big:\n    source: hf://org/big-GGUF:Q8_0\n" +
		"  bigsplit:\n    source: hf://org/big-GGUF:Q8_0\n    file: big-00001-of-00003\n"
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, []string{"--config", cfg})

	params := completion(2)
	params.Model = "big"
	s := c.stream(context.Background(), params, nil)
	const want = "hf://org/big-GGUF:Q8_0 is a split model of 3 parts, served as big-00001-of-00003 (its first part's name), not big; name it big-00001-of-00003 (in the queen's model config, file: big-00001-of-00003)"
	if s.err == nil || !strings.Contains(s.err.Error(), want) {
		t.Errorf("a request for the split model configured as file big: %+v, want an error with %q", s, want)
	}
	if n := hub.Served.Load(); n != 0 {
		t.Errorf("the Hub served %d bytes for a pull that was refused", n)
	}

	params.Model = "bigsplit"
	if s := c.stream(context.Background(), params, nil); s.err != nil || s.tokens != 2 {
		t.Fatalf("a request for the split model configured as file big-00001-of-00003: %+v", s)
	}
	if n := hub.Served.Load(); n != int64(size) {
		t.Errorf("the Hub served %d bytes, want %d (the three parts)", n, size)
	}
	models, err := c.admin.PoolModels(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var refs []string
	for _, pm := range models {
		for _, m := range pm.Models {
			refs = append(refs, fmt.Sprintf("%s %d", m.Ref, m.SizeBytes))
		}
	}
	if !slices.Contains(refs, fmt.Sprintf("big-00001-of-00003 %d", size)) {
		t.Errorf("the pool's models: %v, want big-00001-of-00003 of %d bytes", refs, size)
	}
}
