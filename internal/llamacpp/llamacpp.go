package llamacpp

/*
#include <stdlib.h>
#include "llama.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

// The CPU backend is a library ggml loads (one per instruction-set level),
// so its functions are reached through its registry.
static void *cpu_proc(const char *name) {
	ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
	return cpu ? ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(cpu), name) : NULL;
}

// new_threadpool starts the CPU threads every decode of a context uses, as
// llama.cpp's own server does; without one ggml creates and joins threads
// for every decode.
static struct ggml_threadpool *new_threadpool(int n) {
	struct ggml_threadpool *(*fn)(struct ggml_threadpool_params *) = cpu_proc("ggml_threadpool_new");
	if (!fn) return NULL;
	struct ggml_threadpool_params p = ggml_threadpool_params_default(n);
	return fn(&p);
}

static void free_threadpool(struct ggml_threadpool *tp) {
	void (*fn)(struct ggml_threadpool *) = cpu_proc("ggml_threadpool_free");
	if (fn) fn(tp);
}

// batch_add appends one token to a batch allocated for one sequence id per token.
static void batch_add(struct llama_batch *b, llama_token id, llama_pos pos, llama_seq_id seq, bool logits) {
	int i = b->n_tokens;
	b->token[i] = id;
	b->pos[i] = pos;
	b->n_seq_id[i] = 1;
	b->seq_id[i][0] = seq;
	b->logits[i] = logits ? 1 : 0;
	b->n_tokens = i + 1;
}

// load_progress lets llama.cpp's loader continue until *abort becomes non-zero.
// abort_step is the context's abort callback: ggml reads it between
// the nodes of a step's graph, and llama_decode returns 2 once it says
// so, having removed that step's tokens from the memory again.
static bool abort_step(void *flag) { return __atomic_load_n((int *)flag, __ATOMIC_RELAXED) != 0; }

static void set_abort_step(struct llama_context *ctx, int *flag) { llama_set_abort_callback(ctx, abort_step, flag); }

static bool load_progress(float progress, void *abort) {
	(void)progress;
	return __atomic_load_n((int *)abort, __ATOMIC_RELAXED) == 0;
}

static void set_load_abort(struct llama_model_params *p, int *abort) {
	p->progress_callback = load_progress;
	p->progress_callback_user_data = abort;
}

static void abort_load(int *abort) { __atomic_store_n(abort, 1, __ATOMIC_RELAXED); }

// device_list is a NULL-terminated list of one device in C memory (the
// model parameters handed to C must hold no Go pointer); free it after
// the load, which copies it.
static ggml_backend_dev_t *device_list(ggml_backend_dev_t d) {
	ggml_backend_dev_t *l = calloc(2, sizeof(ggml_backend_dev_t));
	if (l) l[0] = d;
	return l;
}

// gpu_device_list returns the NULL-terminated list of the GPUs ids[0..n)
// (NULL if one is missing or out of memory) and sets split[i] to device
// i's free memory: llama.cpp's tensor_split, proportions of the layers.
static ggml_backend_dev_t gpu_device(int n);
static ggml_backend_dev_t *gpu_device_list(const int *ids, int n, float *split) {
	ggml_backend_dev_t *l = calloc(n + 1, sizeof(ggml_backend_dev_t));
	if (!l) return NULL;
	for (int i = 0; i < n; i++) {
		ggml_backend_dev_t d = gpu_device(ids[i]);
		if (!d) {
			free(l);
			return NULL;
		}
		size_t free_bytes = 0, total = 0;
		ggml_backend_dev_memory(d, &free_bytes, &total);
		l[i] = d;
		split[i] = (float)free_bytes;
	}
	return l;
}

// gpu_device returns the n-th GPU (or integrated GPU) backend device, or NULL.
static ggml_backend_dev_t gpu_device(int n) {
	for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
		ggml_backend_dev_t d = ggml_backend_dev_get(i);
		enum ggml_backend_dev_type t = ggml_backend_dev_type(d);
		if (t == GGML_BACKEND_DEVICE_TYPE_GPU || t == GGML_BACKEND_DEVICE_TYPE_IGPU) {
			if (n-- == 0) return d;
		}
	}
	return NULL;
}
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/engine"
	"github.com/apiary-llm/apiary/internal/gpu"
)

// Engine is a model loaded into one llama.cpp context. One goroutine (run)
// owns the context and decodes all active sequences together, one batch per
// step, the way llama.cpp's own server does.
type Engine struct {
	log   *slog.Logger
	debug bool // log is enabled at Debug: sequences log their timeline
	info  engine.ModelInfo
	model *C.struct_llama_model
	vocab *C.struct_llama_vocab
	lctx  *C.struct_llama_context

	slots     int
	batchSize int
	nCtxSeq   int
	eog       []C.llama_logit_bias // every end-of-generation token with bias -inf, for ignore_eos
	tmpl      *C.char              // the model's chat template, nil when it has none
	vis       vision               // the vision projector (Options.Projector), vision.go
	pool      *C.struct_ggml_threadpool

	threads int

	embMu  sync.Mutex              // serialises embeddings; guards the fields below
	emb    *C.struct_llama_context // guarded by embMu; the embeddings context, made on first use
	embOff bool                    // guarded by embMu; set once the engine is freed
	rank   *C.struct_llama_context // guarded by embMu; a reranker's rank-pooling context, made on first use

	rerank rerankFormat // how a query and a document make a reranker's input (rank.go)

	submit chan []*sequence // the choices of one request, admitted together

	promptDecoded atomic.Int64 // prompt tokens decoded, for tests
	promptReused  atomic.Int64 // prompt tokens taken from a slot's kept KV (kvslots.go)
	kvInUse       atomic.Int64 // KV positions the running sequences hold, as of the decode loop's last step

	cache  *slotCache  // owned by the decode loop: the tokens whose KV each slot keeps (slotcache.go)
	ctl    chan func() // functions the decode loop runs while no sequence is active (kvslots.go)
	kvType string      // the K and V cache types, "f16/f16"

	// Background steps a foreground request ends (see run): abortFlag is
	// C memory that llama.cpp's abort callback reads between the nodes
	// of a step, nil when the model's memory cannot take a step's tokens
	// back out (recurrent and hybrid models); bgStep is set while the
	// loop decodes a step of background tokens only; fgComing counts the
	// foreground requests Generate is handing to the loop.
	abortFlag    *C.int
	bgStep       atomic.Bool
	fgComing     atomic.Int32
	stepsYielded atomic.Int64 // background steps ended or not begun for a foreground request
	// onBackgroundStep, when set (tests, before the first request), is
	// called by the decode loop when it is about to decode a step that a
	// foreground request would end.
	onBackgroundStep func()
	// onStep, when set (tests, before the first request), is called by
	// the decode loop before each step with its tokens of foreground and
	// of background sequences.
	onStep func(fg, bg int)
	// fgRecent is foregroundRecent (tests set another before the first
	// request).
	fgRecent  time.Duration
	quit      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

var _ engine.Engine = (*Engine)(nil)

// Load reads the GGUF at opts.ModelPath, creates a context with opts.Slots
// sequences and warms it up. Cancelling ctx aborts the load between tensors.
func Load(ctx context.Context, opts engine.Options, log *slog.Logger) (*Engine, error) {
	if log == nil {
		log = slog.Default()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if opts.Slots <= 0 {
		opts.Slots = 1
	}
	if opts.Threads <= 0 {
		opts.Threads = runtime.NumCPU()
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = 512
	}
	if _, err := os.Stat(opts.ModelPath); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if _, err := CPUBackend(log); err != nil {
		return nil, err
	}
	routeLogs(log)

	rssBefore := residentBytes()

	mparams := C.llama_model_default_params()
	mparams.load_mode = C.LLAMA_LOAD_MODE_MMAP
	if len(opts.GPUDevices) > 1 {
		if err := splitOver(&mparams, opts, log); err != nil {
			return nil, err
		}
		defer C.free(unsafe.Pointer(mparams.devices))
		defer C.free(unsafe.Pointer(mparams.tensor_split))
	} else if opts.GPUDevice >= 0 {
		if d := C.gpu_device(C.int(opts.GPUDevice)); d != nil {
			devs := C.device_list(d)
			if devs == nil {
				return nil, errors.New("out of memory for the device list")
			}
			defer C.free(unsafe.Pointer(devs))
			mparams.devices = devs
			mparams.n_gpu_layers = 999
			if opts.GPULayers > 0 {
				mparams.n_gpu_layers = C.int32_t(opts.GPULayers)
			}
			mparams.split_mode = C.LLAMA_SPLIT_MODE_NONE
		} else {
			// The worker loads the backend (UseGPU) before it gets here.
			return nil, fmt.Errorf("%w: no GPU %d in ggml's backends (load the GPU backend first)", gpu.ErrNoBackend, opts.GPUDevice)
		}
	} else {
		mparams.n_gpu_layers = 0
	}
	abort := (*C.int)(C.calloc(1, C.size_t(unsafe.Sizeof(C.int(0)))))
	defer C.free(unsafe.Pointer(abort))
	C.set_load_abort(&mparams, abort)
	loaded := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-ctx.Done():
			C.abort_load(abort)
		case <-loaded:
		}
	}()
	cpath := C.CString(opts.ModelPath)
	defer C.free(unsafe.Pointer(cpath))
	model := C.llama_model_load_from_file(cpath, mparams)
	close(loaded)
	<-watched
	if model == nil {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("loading %s: %w", opts.ModelPath, err)
		}
		return nil, fmt.Errorf("llama.cpp could not load %s (see the log above for its reason)", opts.ModelPath)
	}

	trainCtx := int(C.llama_model_n_ctx_train(model))
	nctx := opts.CtxSize
	if nctx <= 0 {
		nctx = min(trainCtx, 4096) * opts.Slots
	}
	cparams := C.llama_context_default_params()
	cparams.n_ctx = C.uint32_t(nctx)
	cparams.n_batch = C.uint32_t(opts.BatchSize)
	cparams.n_ubatch = C.uint32_t(opts.BatchSize)
	cparams.n_seq_max = C.uint32_t(opts.Slots)
	cparams.n_threads = C.int32_t(opts.Threads)
	cparams.n_threads_batch = C.int32_t(opts.Threads)
	cparams.no_perf = true
	cparams.embeddings = false
	cparams.kv_unified = false
	lctx := C.llama_init_from_model(model, cparams)
	if lctx == nil {
		C.llama_model_free(model)
		return nil, fmt.Errorf("llama.cpp could not create a context of %d tokens for %s", nctx, opts.ModelPath)
	}

	e := &Engine{
		log:       log,
		debug:     log.Enabled(ctx, slog.LevelDebug),
		model:     model,
		vocab:     C.llama_model_get_vocab(model),
		lctx:      lctx,
		slots:     opts.Slots,
		batchSize: opts.BatchSize,
		fgRecent:  foregroundRecent,
		threads:   opts.Threads,
		nCtxSeq:   int(C.llama_n_ctx_seq(lctx)),
		submit:    make(chan []*sequence),
		cache:     newSlotCache(opts.Slots),
		ctl:       make(chan func()),
		kvType:    C.GoString(C.ggml_type_name(cparams.type_k)) + "/" + C.GoString(C.ggml_type_name(cparams.type_v)),
		quit:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	if !C.llama_model_is_recurrent(model) && !C.llama_model_is_hybrid(model) {
		e.abortFlag = (*C.int)(C.calloc(1, C.size_t(unsafe.Sizeof(C.int(0)))))
		C.set_abort_step(lctx, e.abortFlag)
	}
	if opts.Threads > 1 {
		if e.pool = C.new_threadpool(C.int(opts.Threads)); e.pool != nil {
			C.llama_attach_threadpool(lctx, e.pool, e.pool)
		}
	}
	nVocab := int(C.llama_vocab_n_tokens(e.vocab))
	for id := range nVocab {
		if C.llama_vocab_is_eog(e.vocab, C.llama_token(id)) {
			e.eog = append(e.eog, C.llama_logit_bias{token: C.llama_token(id), bias: C.float(math.Inf(-1))})
		}
	}
	e.tmpl = C.llama_model_chat_template(model, nil)
	e.info = engine.ModelInfo{
		Architecture: e.metaString("general.architecture"),
		CtxSize:      e.nCtxSeq,
		TrainCtx:     trainCtx,
		Vocab:        nVocab,
	}
	if e.tmpl != nil {
		e.info.ChatTemplate = C.GoString(e.tmpl)
	}
	e.info.Reranker = e.metaString(e.info.Architecture+".pooling_type") == strconv.Itoa(int(C.LLAMA_POOLING_TYPE_RANK))
	e.rerank = e.newRerankFormat()
	e.info.BOSText = e.tokenText(C.llama_vocab_bos(e.vocab))
	e.info.EOSText = e.tokenText(C.llama_vocab_eos(e.vocab))
	if opts.Projector != "" {
		if err := e.loadProjector(opts.Projector, opts.GPUDevice >= 0); err != nil {
			e.free()
			return nil, err
		}
	}
	if err := e.warmup(); err != nil {
		e.free()
		return nil, err
	}
	// What the model really takes: on the CPU the growth of this process's
	// resident memory across load, context creation and a warm-up decode
	// (weights paged in, KV cache and compute buffers touched); never less
	// than the weights llama.cpp reports.
	e.info.MemoryBytes = max(residentBytes()-rssBefore, uint64(C.llama_model_size(model)))
	go e.run()
	log.Info("model loaded", "model", opts.ModelPath, "arch", e.info.Architecture,
		"ctx_per_slot", e.nCtxSeq, "slots", e.slots, "threads", opts.Threads, "memory_bytes", e.info.MemoryBytes,
		"projector", opts.Projector)
	return e, nil
}

// warmup decodes one token so that every buffer is allocated and touched.
func (e *Engine) warmup() error {
	batch := C.llama_batch_init(1, 0, 1)
	defer C.llama_batch_free(batch)
	tok := C.llama_vocab_bos(e.vocab)
	if tok < 0 {
		tok = 0
	}
	C.batch_add(&batch, tok, 0, 0, true)
	if rc := C.llama_decode(e.lctx, batch); rc != 0 {
		return fmt.Errorf("warm-up decode failed (code %d)", int(rc))
	}
	C.llama_memory_clear(C.llama_get_memory(e.lctx), true)
	return nil
}

func (e *Engine) metaString(key string) string {
	ckey := C.CString(key)
	defer C.free(unsafe.Pointer(ckey))
	var buf [256]C.char
	n := C.llama_model_meta_val_str(e.model, ckey, &buf[0], C.size_t(len(buf)))
	if n < 0 {
		return ""
	}
	return C.GoString(&buf[0])
}

// tokenText is a token's text as the vocabulary holds it ("" for none).
func (e *Engine) tokenText(id C.llama_token) string {
	if id < 0 {
		return ""
	}
	return C.GoString(C.llama_vocab_get_text(e.vocab, id))
}

// Info describes the loaded model.
func (e *Engine) Info() engine.ModelInfo { return e.info }

// Tokenize turns text into token ids. Special tokens written in the text
// (such as a chat template's markers) are parsed as such.
func (e *Engine) Tokenize(text string, addSpecial bool) ([]int, error) {
	return e.tokenize(text, addSpecial, true)
}

// tokenize is Tokenize with the choice whether special tokens written in
// the text are parsed as such (parseSpecial) or as plain text.
func (e *Engine) tokenize(text string, addSpecial, parseSpecial bool) ([]int, error) {
	ctext := C.CString(text)
	defer C.free(unsafe.Pointer(ctext))
	n := len(text) + 2
	for range 2 {
		buf := make([]C.llama_token, n)
		got := C.llama_tokenize(e.vocab, ctext, C.int32_t(len(text)), &buf[0], C.int32_t(n), C.bool(addSpecial), C.bool(parseSpecial))
		if got == C.INT32_MIN {
			return nil, errors.New("text too long to tokenize")
		}
		if got < 0 {
			n = int(-got)
			continue
		}
		toks := buf[:got]
		// A prompt that already starts with BOS (a chat template that writes
		// it) must not get a second one from add_special.
		if addSpecial && len(toks) >= 2 && toks[0] == toks[1] && toks[0] == C.llama_vocab_bos(e.vocab) {
			toks = toks[1:]
		}
		ids := make([]int, len(toks))
		for i, t := range toks {
			ids[i] = int(t)
		}
		return ids, nil
	}
	return nil, errors.New("tokenizer disagreed with itself about the token count")
}

// piece returns the raw bytes of a token's text (special tokens render empty).
func (e *Engine) piece(id C.llama_token, buf []byte) []byte {
	n := C.llama_token_to_piece(e.vocab, id, (*C.char)(unsafe.Pointer(&buf[0])), C.int32_t(len(buf)), 0, false)
	if n < 0 {
		buf = make([]byte, int(-n))
		n = C.llama_token_to_piece(e.vocab, id, (*C.char)(unsafe.Pointer(&buf[0])), C.int32_t(len(buf)), 0, false)
	}
	if n <= 0 {
		return nil
	}
	out := make([]byte, int(n))
	copy(out, buf[:n])
	return out
}

// ChatPrompt renders messages with the model's chat template through
// llama.cpp's template engine (it recognises the common template families).
// A model without a template, or with one llama.cpp does not recognise, gets
// the plain fallback documented in docs/worker.md:
//
//	System: …\n\nUser: …\n\nAssistant: …\n\nAssistant:
func (e *Engine) ChatPrompt(msgs []engine.Message) (string, error) {
	if len(msgs) == 0 {
		return "", errors.New("no messages")
	}
	if e.tmpl != nil {
		if s, ok := e.applyTemplate(msgs); ok {
			return s, nil
		}
		e.log.Warn("chat template not recognised by llama.cpp; using the plain fallback")
	}
	return PlainChatPrompt(msgs), nil
}

// PlainChatPrompt is the fallback chat format for models without a template.
func PlainChatPrompt(msgs []engine.Message) string {
	var b strings.Builder
	for _, m := range msgs {
		role := m.Role
		if role != "" {
			role = strings.ToUpper(role[:1]) + role[1:]
		}
		b.WriteString(role)
		b.WriteString(": ")
		b.WriteString(m.Content)
		b.WriteString("\n\n")
	}
	b.WriteString("Assistant:")
	return b.String()
}

func (e *Engine) applyTemplate(msgs []engine.Message) (string, bool) {
	size := C.size_t(unsafe.Sizeof(C.llama_chat_message{}))
	arr := (*[1 << 20]C.llama_chat_message)(C.malloc(size * C.size_t(len(msgs))))[:len(msgs):len(msgs)]
	defer C.free(unsafe.Pointer(&arr[0]))
	total := 0
	for i, m := range msgs {
		arr[i].role = C.CString(m.Role)
		arr[i].content = C.CString(m.Content)
		total += len(m.Role) + len(m.Content)
	}
	defer func() {
		for i := range arr {
			C.free(unsafe.Pointer(arr[i].role))
			C.free(unsafe.Pointer(arr[i].content))
		}
	}()
	n := 2*total + 256
	for range 2 {
		buf := C.malloc(C.size_t(n))
		got := C.llama_chat_apply_template(e.tmpl, &arr[0], C.size_t(len(msgs)), true, (*C.char)(buf), C.int32_t(n))
		if got < 0 {
			C.free(buf)
			return "", false
		}
		if int(got) > n {
			C.free(buf)
			n = int(got)
			continue
		}
		s := C.GoStringN((*C.char)(buf), got)
		C.free(buf)
		return s, true
	}
	return "", false
}

// Close stops the decode loop, ends generations in flight with
// engine.ErrClosed and frees the context and the model. It is idempotent.
//
// Order: 1. stop accepting sequences; 2. the loop finishes every active
// sequence and exits; 3. the context is freed; 4. the model is freed.
func (e *Engine) Close() error {
	e.closeOnce.Do(func() {
		close(e.quit)
		<-e.done
		e.free()
	})
	return nil
}

func (e *Engine) free() {
	e.embMu.Lock()
	if e.emb != nil {
		C.llama_free(e.emb)
		e.emb = nil
	}
	if e.rank != nil {
		C.llama_free(e.rank)
		e.rank = nil
	}
	e.embOff = true
	e.embMu.Unlock()
	e.vis.free()
	if e.lctx != nil {
		C.llama_free(e.lctx)
		e.lctx = nil
	}
	if e.abortFlag != nil {
		C.free(unsafe.Pointer(e.abortFlag))
		e.abortFlag = nil
	}
	if e.pool != nil {
		C.free_threadpool(e.pool)
		e.pool = nil
	}
	if e.model != nil {
		C.llama_model_free(e.model)
		e.model = nil
	}
}

// residentBytes is this process's resident set size (0 when unknown).
func residentBytes() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0
			}
			return kb * 1024
		}
	}
	return 0
}

// splitOver sets mparams to split the model over opts.GPUDevices:
// llama.cpp's layer split (or row split, opts.SplitMode) with tensor_split
// in proportion to each device's free memory now. The device list and
// the split are C memory the caller frees after the load.
func splitOver(mparams *C.struct_llama_model_params, opts engine.Options, log *slog.Logger) error {
	n := len(opts.GPUDevices)
	if maxDevs := int(C.llama_max_devices()); n > maxDevs {
		return fmt.Errorf("%d GPUs: llama.cpp splits a model over %d at most", n, maxDevs)
	}
	ids := (*C.int)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(C.int(0)))))
	defer C.free(unsafe.Pointer(ids))
	idv := unsafe.Slice(ids, n)
	for i, id := range opts.GPUDevices {
		idv[i] = C.int(id)
	}
	split := (*C.float)(C.calloc(C.llama_max_devices(), C.size_t(unsafe.Sizeof(C.float(0)))))
	if split == nil {
		return errors.New("out of memory for the tensor split")
	}
	devs := C.gpu_device_list(ids, C.int(n), split)
	if devs == nil {
		C.free(unsafe.Pointer(split))
		return fmt.Errorf("%w: ggml's backends lack a GPU of %v (load the GPU backend first)", gpu.ErrNoBackend, opts.GPUDevices)
	}
	mparams.devices = devs
	mparams.tensor_split = split
	mparams.main_gpu = 0
	mparams.n_gpu_layers = 999
	if opts.GPULayers > 0 {
		mparams.n_gpu_layers = C.int32_t(opts.GPULayers)
	}
	mode := "layer"
	mparams.split_mode = C.LLAMA_SPLIT_MODE_LAYER
	if opts.SplitMode == engine.SplitRow {
		mode = "row"
		mparams.split_mode = C.LLAMA_SPLIT_MODE_ROW
	}
	props := make([]any, 0, 2*n+2)
	props = append(props, "split_mode", mode)
	for i, f := range unsafe.Slice(split, n) {
		props = append(props, fmt.Sprintf("gpu_%d_free", opts.GPUDevices[i]), api.FormatBytes(uint64(f)))
	}
	log.Info("splitting the model over GPUs in proportion to their free memory", props...)
	return nil
}
