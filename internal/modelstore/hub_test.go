package modelstore_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/gguf"
	"github.com/apiary-llm/apiary/internal/modelstore"
	"github.com/apiary-llm/apiary/internal/testhub"
	"github.com/apiary-llm/apiary/internal/testmodel"
)

// fastRetries makes a broken download retry at once.
var fastRetries = modelstore.PullOptions{RetryDelay: time.Millisecond}

func model(t *testing.T, seed int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := testmodel.Write(&buf, testmodel.Options{Seed: seed}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestPullHubByQuant(t *testing.T) {
	q4, q8, proj := model(t, 1), model(t, 2), model(t, 3)
	h := testhub.New(t, "org/tiny-GGUF", map[string][]byte{
		"tiny-Q4_K_M.gguf": q4, "tiny-Q8_0.gguf": q8, "README.md": []byte("# tiny"), "mmproj-tiny-f16.gguf": proj,
		"mmproj-tiny-Q4_0.gguf": model(t, 4),
	})
	dir := t.TempDir()
	var last modelstore.Progress
	opts := fastRetries
	opts.Progress = func(p modelstore.Progress) { last = p }
	m, err := modelstore.Pull(t.Context(), dir, "hf://org/tiny-GGUF:q4_k_m", opts)
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	if m.Ref != "tiny-Q4_K_M" || m.Size != int64(len(q4)) || m.Info == nil || m.Info.Architecture != "llama" {
		t.Errorf("Pull returned %+v", m)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "tiny-Q4_K_M.gguf")); !bytes.Equal(got, q4) {
		t.Error("the pulled file differs from the Hub's")
	}
	// The repository's vision projector (its F16 one of two) comes with
	// the model, named after it; the model's size is its own.
	if got, _ := os.ReadFile(filepath.Join(dir, "mmproj-tiny-Q4_K_M.gguf")); !bytes.Equal(got, proj) || m.Projector != filepath.Join(dir, "mmproj-tiny-Q4_K_M.gguf") {
		t.Errorf("the projector: %q, %d bytes of the Hub's F16 one", m.Projector, len(got))
	}
	if want := (modelstore.Progress{File: last.File, Written: int64(len(q4) + len(proj)), Total: int64(len(q4) + len(proj))}); last != want {
		t.Errorf("last progress %+v, want %+v", last, want)
	}
	if n := h.ListCalls.Load(); n != 3 {
		t.Errorf("the file list (5 files) was read in %d pages, want 3 (two entries a page)", n)
	}
	// As Ollama users write it, with another name.
	opts.Ref = "tiny8"
	if m, err = modelstore.Pull(t.Context(), dir, "hf.co/org/tiny-GGUF:Q8_0", opts); err != nil || m.Ref != "tiny8" {
		t.Fatalf("Pull hf.co/…:Q8_0 = %+v, %v", m, err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "tiny8.gguf")); !bytes.Equal(got, q8) {
		t.Error("the pulled Q8_0 file differs from the Hub's")
	}
	if diff := cmp.Diff([]string{"mmproj-tiny-Q4_K_M.gguf", "mmproj-tiny8.gguf", "tiny-Q4_K_M.gguf", "tiny8.gguf"}, dirEntries(t, dir)); diff != "" {
		t.Errorf("directory entries (-want +got):\n%s", diff)
	}
	// The projectors are no models: each is its model's.
	models, err := modelstore.List(dir)
	if err != nil || len(models) != 2 || models[0].Projector == "" || models[1].Projector != filepath.Join(dir, "mmproj-tiny8.gguf") {
		t.Errorf("List: %+v, %v; want the two models with their projectors", models, err)
	}
}

func TestPullHubByFile(t *testing.T) {
	q8 := model(t, 2)
	h := testhub.New(t, "org/tiny-GGUF", map[string][]byte{"sub/tiny-Q8_0.gguf": q8, "tiny-Q4_K_M.gguf": model(t, 1)})
	h.NoLFS("sub/tiny-Q8_0.gguf") // its sha256 comes from a HEAD's X-Linked-Etag
	src, err := modelstore.ResolveSource(t.Context(), nil, modelstore.HubFromEnv(), "hf://org/tiny-GGUF/sub/tiny-Q8_0.gguf")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(q8)
	want := modelstore.Source{Ref: "hf://org/tiny-GGUF/sub/tiny-Q8_0.gguf", Name: "tiny-Q8_0", Files: []modelstore.RemoteFile{{
		URL: h.API.URL + "/org/tiny-GGUF/resolve/main/sub/tiny-Q8_0.gguf", Path: "sub/tiny-Q8_0.gguf", Size: int64(len(q8)), SHA256: hex.EncodeToString(sum[:]),
	}}}
	if diff := cmp.Diff(want, src); diff != "" {
		t.Errorf("ResolveSource (-want +got):\n%s", diff)
	}
	dir := t.TempDir()
	m, err := modelstore.Pull(t.Context(), dir, src.Ref, fastRetries)
	if err != nil || m.Ref != "tiny-Q8_0" {
		t.Fatalf("Pull = %+v, %v", m, err)
	}
	if got, _ := os.ReadFile(m.Path); !bytes.Equal(got, q8) {
		t.Error("the pulled file differs from the Hub's")
	}
	// The wrong digest in the HEAD's answer is refused too.
	h.Publish("sub/tiny-Q8_0.gguf", strings.Repeat("ab", 32))
	_, err = modelstore.Pull(t.Context(), t.TempDir(), src.Ref, fastRetries)
	if !errors.Is(err, modelstore.ErrChecksum) {
		t.Errorf("Pull with a wrong X-Linked-Etag = %v, want ErrChecksum", err)
	}
}

func TestPullHubSplitModel(t *testing.T) {
	parts := [][]byte{model(t, 1), model(t, 2), model(t, 3)}
	files := map[string][]byte{"tiny-Q4_K_M.gguf": model(t, 4)}
	for i, p := range parts {
		files[fmt.Sprintf("Q8_0/tiny-Q8_0-%05d-of-00003.gguf", i+1)] = p
	}
	testhub.New(t, "org/tiny-GGUF", files)
	dir := t.TempDir()
	m, err := modelstore.Pull(t.Context(), dir, "hf://org/tiny-GGUF:Q8_0", fastRetries)
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	size := int64(len(parts[0]) + len(parts[1]) + len(parts[2]))
	if m.Ref != "tiny-Q8_0-00001-of-00003" || m.Size != size {
		t.Errorf("Pull returned %+v, want ref tiny-Q8_0-00001-of-00003 of %d bytes", m, size)
	}
	for i, p := range parts {
		if got, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("tiny-Q8_0-%05d-of-00003.gguf", i+1))); !bytes.Equal(got, p) {
			t.Errorf("part %d differs from the Hub's", i+1)
		}
	}
	// Its weights are every part's tensors, not only the first part's.
	var weights uint64
	for _, p := range parts {
		f, err := gguf.Read(bytes.NewReader(p), int64(len(p)))
		if err != nil {
			t.Fatal(err)
		}
		weights += f.Info().WeightsBytes
	}
	if m.Info == nil || m.Info.WeightsBytes != weights {
		t.Errorf("Pull's Info = %+v, want weights_bytes %d (all three parts)", m.Info, weights)
	}
	// Listed once, with the size of all parts; without a part, with why.
	list, err := modelstore.List(dir)
	if err != nil || len(list) != 1 || list[0].Ref != m.Ref || list[0].Size != size || list[0].Error != "" {
		t.Fatalf("List = %+v, %v; want the one split model of %d bytes", list, err, size)
	}
	if list[0].Info == nil || list[0].Info.WeightsBytes != weights {
		t.Errorf("List's Info = %+v, want weights_bytes %d (all three parts)", list[0].Info, weights)
	}
	if info, err := modelstore.ReadInfo(m.Path); err != nil || info.WeightsBytes != weights {
		t.Errorf("ReadInfo = %+v, %v; want weights_bytes %d", info, err, weights)
	}
	// Pulled under the ref it is served as (a model config's file names
	// the model so), the parts keep the same names.
	opts := fastRetries
	opts.Ref, opts.Overwrite = "tiny-Q8_0-00001-of-00003", true
	if m2, err := modelstore.Pull(t.Context(), dir, "hf://org/tiny-GGUF:Q8_0", opts); err != nil || m2.Ref != m.Ref || m2.Path != m.Path {
		t.Errorf("Pull named %s = %+v, %v; want the same model", opts.Ref, m2, err)
	}
	want := []string{"tiny-Q8_0-00001-of-00003.gguf", "tiny-Q8_0-00002-of-00003.gguf", "tiny-Q8_0-00003-of-00003.gguf"}
	if diff := cmp.Diff(want, dirEntries(t, dir)); diff != "" {
		t.Errorf("directory entries (-want +got):\n%s", diff)
	}
	os.Remove(filepath.Join(dir, "tiny-Q8_0-00002-of-00003.gguf"))
	list, _ = modelstore.List(dir)
	if len(list) != 1 || list[0].Info != nil || !strings.Contains(list[0].Error, "part 2 of 3 (tiny-Q8_0-00002-of-00003.gguf) is missing") {
		t.Errorf("List without part 2 = %+v", list)
	}
	// A file of a split model names all of it.
	src, err := modelstore.ResolveSource(t.Context(), nil, modelstore.HubFromEnv(), "hf://org/tiny-GGUF/Q8_0/tiny-Q8_0-00002-of-00003.gguf")
	if err != nil || len(src.Files) != 3 || !src.Split {
		t.Errorf("ResolveSource of part 2 = %+v, %v; want the three parts", src, err)
	}
}

func TestPullHubResumesABrokenConnection(t *testing.T) {
	tiny := model(t, 1)
	h := testhub.New(t, "org/tiny-GGUF", map[string][]byte{"tiny-Q4_K_M.gguf": tiny})
	h.CutAfter("tiny-Q4_K_M.gguf", 1000, 2000)
	dir := t.TempDir()
	m, err := modelstore.Pull(t.Context(), dir, "hf://org/tiny-GGUF:Q4_K_M", fastRetries)
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	if got, _ := os.ReadFile(m.Path); !bytes.Equal(got, tiny) {
		t.Error("the resumed file differs from the Hub's")
	}
	if diff := cmp.Diff([]string{"", "bytes=1000-", "bytes=3000-"}, h.Ranges()); diff != "" {
		t.Errorf("Range headers (-want +got):\n%s", diff)
	}
	if n := h.Served.Load(); n != int64(len(tiny)) {
		t.Errorf("the CDN served %d bytes, want %d: the download was restarted, not resumed", n, len(tiny))
	}
}

// A download that stops coming while its connection stays open hung
// forever (stuck at 40% for 200 s): only broken connections were
// retried. Now an attempt that receives no byte for the stall timeout is
// aborted and resumed from where it was, with Range, and Retrying says so:
// here a connection that sends its head and no byte, then one that stalls
// after 1000 bytes.
func TestPullHubResumesAStalledDownload(t *testing.T) {
	tiny := model(t, 1)
	h := testhub.New(t, "org/tiny-GGUF", map[string][]byte{"tiny-Q4_K_M.gguf": tiny})
	h.StallAfter("tiny-Q4_K_M.gguf", 0, 1000)
	var retries []string
	opts := fastRetries
	opts.StallTimeout = 200 * time.Millisecond
	opts.Retrying = func(r modelstore.Retry) {
		if _, ok := errors.AsType[*modelstore.StallError](r.Err); !ok || !errors.Is(r.Err, modelstore.ErrDownload) {
			t.Errorf("retry after %v, want a stall", r.Err)
		}
		retries = append(retries, r.String())
	}
	start := time.Now()
	m, err := modelstore.Pull(t.Context(), t.TempDir(), "hf://org/tiny-GGUF:Q4_K_M", opts)
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	t.Logf("pulled in %s through two stalls of %s", time.Since(start).Round(time.Millisecond), opts.StallTimeout)
	if got, _ := os.ReadFile(m.Path); !bytes.Equal(got, tiny) {
		t.Error("the resumed file differs from the Hub's")
	}
	want := []string{"no bytes for 200ms; resuming at 0 bytes", "no bytes for 200ms; resuming at 1000 bytes"}
	if diff := cmp.Diff(want, retries); diff != "" {
		t.Errorf("retries (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"", "", "bytes=1000-"}, h.Ranges()); diff != "" {
		t.Errorf("Range headers (-want +got):\n%s", diff)
	}
	if n := h.Served.Load(); n != int64(len(tiny)) {
		t.Errorf("the CDN served %d bytes, want %d: the download was restarted, not resumed", n, len(tiny))
	}
}

// A download that stalls at every attempt fails once the retries are
// spent, saying that no bytes came, and keeps what it wrote to resume.
func TestPullHubGivesUpOnADownloadThatAlwaysStalls(t *testing.T) {
	tiny := model(t, 1)
	h := testhub.New(t, "org/tiny-GGUF", map[string][]byte{"tiny-Q4_K_M.gguf": tiny})
	h.StallAfter("tiny-Q4_K_M.gguf", 1000, 0, 0)
	opts := fastRetries
	opts.StallTimeout, opts.Retries = 100*time.Millisecond, 2
	dir := t.TempDir()
	_, err := modelstore.Pull(t.Context(), dir, "hf://org/tiny-GGUF:Q4_K_M", opts)
	if !errors.Is(err, modelstore.ErrDownload) || !strings.Contains(err.Error(), "no bytes for 100ms after 1000 bytes") {
		t.Fatalf("Pull of a download that always stalls = %v", err)
	}
	if diff := cmp.Diff([]string{"tiny-Q4_K_M.gguf.partial"}, dirEntries(t, dir)); diff != "" {
		t.Errorf("after the failed pull (-want +got):\n%s", diff)
	}
}

func TestPullHubResumesAcrossRuns(t *testing.T) {
	tiny := model(t, 1)
	h := testhub.New(t, "org/tiny-GGUF", map[string][]byte{"tiny-Q4_K_M.gguf": tiny})
	h.CutAfter("tiny-Q4_K_M.gguf", 1500, 0)
	dir := t.TempDir()
	opts := fastRetries
	opts.Retries = 1
	_, err := modelstore.Pull(t.Context(), dir, "hf://org/tiny-GGUF:Q4_K_M", opts)
	if !errors.Is(err, modelstore.ErrDownload) {
		t.Fatalf("Pull with the connection cut twice = %v, want ErrDownload", err)
	}
	if diff := cmp.Diff([]string{"tiny-Q4_K_M.gguf.partial"}, dirEntries(t, dir)); diff != "" {
		t.Fatalf("after the failed pull (-want +got):\n%s", diff)
	}
	if list, _ := modelstore.List(dir); len(list) != 0 {
		t.Errorf("List offers %+v, a partial download", list)
	}
	h.Served.Store(0)
	var last modelstore.Progress
	opts.Progress = func(p modelstore.Progress) { last = p }
	m, err := modelstore.Pull(t.Context(), dir, "hf://org/tiny-GGUF:Q4_K_M", opts)
	if err != nil {
		t.Fatalf("second Pull: %v", err)
	}
	if got, _ := os.ReadFile(m.Path); !bytes.Equal(got, tiny) {
		t.Error("the resumed file differs from the Hub's")
	}
	if n := h.Served.Load(); n != int64(len(tiny))-1500 {
		t.Errorf("the second pull was served %d bytes, want %d (the rest)", n, len(tiny)-1500)
	}
	if last.Resumed != 1500 || last.Written != int64(len(tiny)) {
		t.Errorf("last progress %+v, want 1500 resumed", last)
	}
	if diff := cmp.Diff([]string{"tiny-Q4_K_M.gguf"}, dirEntries(t, dir)); diff != "" {
		t.Errorf("directory entries (-want +got):\n%s", diff)
	}
}

func TestPullHubRefusals(t *testing.T) {
	tiny := model(t, 1)
	files := map[string][]byte{"tiny-Q4_K_M.gguf": tiny, "tiny-Q8_0.gguf": model(t, 2), "other-Q8_0.gguf": model(t, 3)}
	tests := []struct {
		name  string
		ref   string
		setup func(h *testhub.Hub, opts *modelstore.PullOptions)
		err   error
		msg   string
	}{
		{"checksum", "hf://org/tiny-GGUF:Q4_K_M", func(h *testhub.Hub, _ *modelstore.PullOptions) {
			h.Publish("tiny-Q4_K_M.gguf", strings.Repeat("0", 64))
		},
			modelstore.ErrChecksum, "has sha256 " + hex.EncodeToString(sha256sum(tiny)) + ", the Hub publishes " + strings.Repeat("0", 64) + "; the download was deleted"},
		{"unknown repository", "hf://org/nothing:Q4_K_M", nil, modelstore.ErrNoModel, "no repository org/nothing at http://"},
		{"unknown quant", "hf://org/tiny-GGUF:Q5_K_S", nil, modelstore.ErrNoModel,
			"org/tiny-GGUF has no GGUF file of quantization Q5_K_S; available: Q8_0 (other-Q8_0.gguf), Q4_K_M (tiny-Q4_K_M.gguf), Q8_0 (tiny-Q8_0.gguf)"},
		{"several match", "hf://org/tiny-GGUF:q8_0", nil, modelstore.ErrNoModel,
			"quantization q8_0 of org/tiny-GGUF matches several files (other-Q8_0.gguf, tiny-Q8_0.gguf); name one as hf://org/tiny-GGUF/FILE.gguf"},
		{"no quant", "hf://org/tiny-GGUF", nil, modelstore.ErrNoModel, "has several GGUF models; name one as hf://org/tiny-GGUF:QUANT"},
		{"unknown file", "hf://org/tiny-GGUF/tiny-Q2_K.gguf", nil, modelstore.ErrNoModel, "org/tiny-GGUF has no file tiny-Q2_K.gguf; available: "},
		{"gated", "hf://org/tiny-GGUF:Q4_K_M", func(h *testhub.Hub, _ *modelstore.PullOptions) { h.Gate("secret") },
			modelstore.ErrGated, "401 Unauthorized for org/tiny-GGUF: the repository is gated or private; accept its terms on the Hub and set HF_TOKEN"},
		{"token refused", "hf://org/tiny-GGUF:Q4_K_M", func(h *testhub.Hub, o *modelstore.PullOptions) {
			h.Gate("secret")
			o.Hub = modelstore.Hub{Endpoint: h.API.URL, Token: "wrong"}
		}, modelstore.ErrGated, "HF_TOKEN was refused"},
		{"bad ref", "hf://org", nil, modelstore.ErrBadURL, "no repository"},
		{"disk full", "hf://org/tiny-GGUF:Q4_K_M", func(_ *testhub.Hub, o *modelstore.PullOptions) {
			o.FreeSpace = func(string) (uint64, error) { return 1000, nil }
		}, modelstore.ErrNoSpace, "the download needs " + api.FormatBytes(uint64(len(tiny))) + ", "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := testhub.New(t, "org/tiny-GGUF", files)
			opts := fastRetries
			if tt.setup != nil {
				tt.setup(h, &opts)
			}
			dir := t.TempDir()
			_, err := modelstore.Pull(t.Context(), dir, tt.ref, opts)
			if !errors.Is(err, tt.err) || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("Pull = %v, want %v saying %q", err, tt.err, tt.msg)
			}
			if entries := dirEntries(t, dir); len(entries) != 0 {
				t.Errorf("the models dir holds %v after a refused pull, want nothing", entries)
			}
			if tt.err == modelstore.ErrNoSpace && h.Served.Load() != 0 {
				t.Errorf("%d bytes were downloaded before the refusal", h.Served.Load())
			}
		})
	}
}

func TestPullHubGatedWithToken(t *testing.T) {
	tiny := model(t, 1)
	h := testhub.New(t, "org/tiny-GGUF", map[string][]byte{"tiny-Q4_K_M.gguf": tiny})
	h.Gate("secret")
	t.Setenv("HF_TOKEN", "secret")
	if _, err := modelstore.Pull(t.Context(), t.TempDir(), "hf://org/tiny-GGUF:Q4_K_M", fastRetries); err != nil {
		t.Errorf("Pull with HF_TOKEN: %v", err)
	}
}

func sha256sum(b []byte) []byte {
	s := sha256.Sum256(b)
	return s[:]
}
