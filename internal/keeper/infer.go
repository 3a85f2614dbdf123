package keeper

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	neturl "net/url"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/config"
	"github.com/apiary-llm/apiary/internal/datadir"
	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/rpc"
	"github.com/apiary-llm/apiary/internal/secret"
	"github.com/apiary-llm/apiary/internal/sshnode"
	"github.com/apiary-llm/apiary/internal/termtext"
	"github.com/apiary-llm/apiary/internal/transport"
)

// Modes of `apiary infer` (docs/ownership.md, "`apiary infer`").
const (
	// ModePersistent: a queen answers at the URL; the keeper uses it and
	// leaves it (and its hives and workers) running.
	ModePersistent = "persistent"
	// ModeEphemeral: none answers, or InferConfig.Ephemeral asks for it;
	// the keeper starts a queen with a local hive, answers the prompt, and
	// stops everything it started.
	ModeEphemeral = "ephemeral"
)

// InferConfig is one `apiary infer`.
type InferConfig struct {
	QueenURL string
	// Ephemeral starts a queen and a local hive for the prompt (on free
	// ports) whether or not a queen answers at QueenURL, which it never
	// asks; default false: ephemeral mode only when none answers.
	Ephemeral bool
	Model     string // a model ref, or (ephemeral mode) a path to a .gguf file
	Prompt    string
	MaxTokens int    // 0: the worker's default
	Node      string // pin the request to this node's pool
	// Ephemeral mode with Node: the queen it starts starts a hive on the
	// node over SSH (as `apiary nodes add` does).
	SSH        string        // USER@HOST[:PORT] of the node's sshd
	SSHConfig  string        // ssh client configuration (ssh -F); default the user's
	InstallDir string        // where apiary lives on the node; default ~/.local/bin
	Tokens     secret.Tokens // the bearer tokens it sends

	Stdout io.Writer // the answer, token by token
	Stderr io.Writer // progress and diagnostics
	// Terminal rewrites one progress line in place (stderr is a terminal);
	// otherwise progress is plain lines, one per change.
	Terminal bool

	// Ephemeral mode.
	Binary        string   // apiary to run as the queen; default this executable
	ModelsDir     string   // where a ref is looked up; default DefaultModelsDir()
	WorkerThreads int      // the local workers' threads (0: one per CPU)
	QueenArgs     []string // extra flags of the ephemeral queen
	TempDir       string   // parent of the throwaway data dir; default os.TempDir()

	DetectTimeout time.Duration // how long a queen has to answer /health; default 2s
	StartTimeout  time.Duration // queen and local hive up; default 60s
	StopTimeout   time.Duration // the ephemeral queen's cascade; default 120s
	Logger        *slog.Logger
}

// Defaults of InferConfig.
const (
	DefaultDetectTimeout = 2 * time.Second
	DefaultStartTimeout  = 60 * time.Second
	DefaultStopTimeout   = 120 * time.Second
)

// DefaultModelsDir is where `apiary models` keeps GGUF files:
// $XDG_DATA_HOME/apiary/models, or ~/.local/share/apiary/models.
func DefaultModelsDir() string { return datadir.Models() }

// ErrUsage marks a mistake in what the keeper was asked (exit code 2).
var ErrUsage = errors.New("usage error")

// refPattern is a model ref or node name, at most 200 bytes (validRef):
// the length is left to the code, as a counted repetition ({0,199})
// compiles into a regexp program of that many copies, which cost every
// process start milliseconds.
var refPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]*$`)

func validRef(s string) bool { return len(s) <= 200 && refPattern.MatchString(s) }

func (c InferConfig) withDefaults() InferConfig {
	config.Default(&c.Stdout, io.Discard)
	config.Default(&c.Stderr, io.Discard)
	config.Default(&c.ModelsDir, DefaultModelsDir())
	config.Default(&c.DetectTimeout, DefaultDetectTimeout)
	config.Default(&c.StartTimeout, DefaultStartTimeout)
	config.Default(&c.StopTimeout, DefaultStopTimeout)
	config.Default(&c.Logger, slog.New(slog.DiscardHandler))
	c.QueenURL = strings.TrimSuffix(c.QueenURL, "/")
	return c
}

// Validate reports every problem with c at once, by field
// (config.FieldError); the error is ErrUsage.
func (c InferConfig) Validate() error {
	var p config.Problems
	if strings.TrimSpace(c.Model) == "" {
		p.Add("Model", "is required: a model ref (tiny) or a path to a .gguf file")
	}
	if c.Prompt == "" {
		p.Add("Prompt", "is required")
	}
	if c.MaxTokens < 0 {
		p.Add("MaxTokens", "must not be negative, got %d", c.MaxTokens)
	}
	if c.WorkerThreads < 0 {
		p.Add("WorkerThreads", "must not be negative, got %d", c.WorkerThreads)
	}
	if c.Node != "" && !validRef(c.Node) {
		p.Add("Node", "%q is not a node name", c.Node)
	}
	if c.Node == "" {
		for field, v := range map[string]string{"SSH": c.SSH, "SSHConfig": c.SSHConfig, "InstallDir": c.InstallDir} {
			if v != "" {
				p.Add(field, "is for a node: give --node NAME with it")
			}
		}
	}
	if c.SSH != "" {
		if _, err := sshnode.ParseTarget(c.SSH); err != nil {
			p.Add("SSH", "%v", err)
		}
	}
	if c.InstallDir != "" {
		if err := sshnode.CheckInstallDir(c.InstallDir); err != nil {
			p.Add("InstallDir", "%v", err)
		}
	}
	if _, err := transport.BaseURLs("", c.QueenURL); err != nil {
		p.Add("QueenURL", "%s", strings.TrimSpace(err.Error()))
	}
	if err := p.Err(); err != nil {
		return usage{err}
	}
	return nil
}

// usage marks an error as ErrUsage without changing its message.
type usage struct{ error }

func (u usage) Unwrap() error        { return u.error }
func (u usage) Is(target error) bool { return target == ErrUsage }

// usagef is fmt.Errorf marked as ErrUsage: the message is only what went
// wrong and what to do, with no marker in its text.
func usagef(format string, a ...any) error { return usage{fmt.Errorf(format, a...)} }

// Infer answers one prompt. Create it with NewInfer, run it with Run.
type Infer struct {
	cfg  InferConfig
	log  *slog.Logger
	mode chan string // receives the mode once Run has chosen it
}

// NewInfer checks cfg (after defaults).
func NewInfer(cfg InferConfig) (*Infer, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Infer{cfg: cfg, log: cfg.Logger.With("component", "keeper"), mode: make(chan string, 1)}, nil
}

// Mode is closed over the mode Run chose (for tests and diagnostics).
func (k *Infer) Mode() <-chan string { return k.mode }

// Run picks the mode, streams the answer to Stdout and returns. In
// ephemeral mode it stops the queen it started (which stops its hive,
// which stops its workers) before it returns, however it returns: done,
// failed, or ctx cancelled (Ctrl+C, SIGTERM). In persistent mode it leaves
// everything running.
func (k *Infer) Run(ctx context.Context) (err error) {
	mode, url := ModeEphemeral, ""
	if !k.cfg.Ephemeral {
		if mode, url, err = k.detect(ctx); err != nil {
			return err
		}
	}
	k.mode <- mode
	k.log.Debug("mode", "mode", mode, "queen", url)
	var ref string
	if mode == ModeEphemeral {
		if k.cfg.Node != "" && k.cfg.SSH == "" {
			if k.cfg.Ephemeral {
				return usagef("--node %s with --ephemeral: give the node's --ssh USER@HOST[:PORT] to start a hive there for this prompt", k.cfg.Node)
			}
			return usagef("--node %s: no queen answers at %s; give the node's --ssh USER@HOST[:PORT] to start a hive there for this prompt, "+
				"or start a queen that knows the node (apiary queen, apiary nodes add)", k.cfg.Node, k.cfg.QueenURL)
		}
		eph := &ephemeral{k: k}
		defer func() {
			if terr := eph.teardown(ctx.Err() != nil); terr != nil {
				err = errors.Join(err, terr)
			}
		}()
		if ref, err = eph.start(ctx); err != nil {
			return err
		}
		url = eph.url
	} else if k.cfg.SSH != "" {
		return usagef("--ssh starts a hive on the node when no queen answers, but a queen answers at %s: drop --ssh (add the node to that queen with apiary nodes add)",
			url)
	} else if ref, err = persistentRef(k.cfg.Model); err != nil {
		return err
	} else {
		// The queen may be one the person never started (anything at the
		// default address): say which it is, and how to choose.
		fmt.Fprintf(k.cfg.Stderr, "a queen answers at %s: asking it (it keeps running; --ephemeral starts a throwaway queen and hive for this prompt instead, --queen URL asks another queen)\n",
			url)
	}
	if err = k.generate(ctx, url, ref); err != nil && mode == ModePersistent {
		var ae *APIError
		if errors.As(err, &ae) && (ae.Status == http.StatusUnauthorized || ae.Status == http.StatusForbidden) {
			err = fmt.Errorf("%w; the queen at %s wants a token (APIARY_API_TOKEN); if it is not yours, pass --ephemeral to start a throwaway queen and hive for this prompt", err, url)
		}
	}
	return err
}

// persistentRef is the ref to ask a running queen for. A path is
// refused: the queen serves models by ref from its hives' models dirs and
// cannot load a file of this machine, nor tell whether the pool's model of
// that name is this very file; sending its name would silently answer with
// whatever file the pools have under it.
func persistentRef(model string) (string, error) {
	if looksLikePath(model) {
		ref := strings.TrimSuffix(filepath.Base(model), ".gguf")
		return "", usagef("--model %s is a path, but a queen answers at --queen: it serves models by ref from its hives' models dirs, "+
			"cannot load this file and cannot tell whether its pools' %s is the same file. Use the ref (--model %s: %s.gguf in the hives' models dir), "+
			"or pass --ephemeral to load the file itself (ephemeral mode: a throwaway queen and hive of its own)",
			model, ref, ref, ref)
	}
	if !validRef(model) {
		return "", usagef("--model %q is neither a model ref nor a path to a .gguf file", model)
	}
	return model, nil
}

func looksLikePath(model string) bool {
	return strings.ContainsRune(model, '/') || strings.HasSuffix(model, ".gguf")
}

// oneShotClient is a client for one request: apiary's TLS settings, no
// redirects, no connection kept.
func oneShotClient() *http.Client {
	t := transport.NewTransport()
	t.DisableKeepAlives = true
	return transport.NewClient(t, 0)
}

// detect asks GET /health of the queens (queens.call): the active
// queen's answer is persistent mode, at its URL; nothing answering is
// ephemeral mode; queens that all stand by, or anything else answering,
// is an error.
func (k *Infer) detect(ctx context.Context) (mode, active string, err error) {
	ctx, cancel := context.WithTimeout(ctx, k.cfg.DetectTimeout)
	defer cancel()
	standby := false
	err = newQueens(k.cfg.QueenURL).call(ctx, true, false, func(base string) error {
		mode, err := k.health(ctx, base)
		if errors.As(err, new(*errStandby)) {
			standby = true
		}
		if err == nil && mode == ModePersistent {
			active = base
		}
		return err
	})
	switch {
	case err == nil:
		return ModePersistent, active, nil
	case errors.Is(err, ErrUnreachable) && !standby:
		if pctx := context.Cause(ctx); errors.Is(pctx, context.Canceled) {
			return "", "", pctx
		}
		k.log.Debug("no queen answers; ephemeral mode", "queen", k.cfg.QueenURL, "err", err)
		return ModeEphemeral, "", nil
	case errors.Is(err, ErrUnreachable):
		// Queens answer, but none as the active one: starting one of its
		// own would only answer beside them.
		return "", "", fmt.Errorf("%w; for a throwaway queen and hive of its own pass --ephemeral", err)
	}
	return "", "", err
}

// health asks base's GET /health: nil for an apiary queen's answer; an
// error wrapping rpc.ErrUnreachable when nothing answers, *errStandby for
// a standby's.
func (k *Infer) health(ctx context.Context, base string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/health", nil)
	if err != nil {
		return "", usagef("--queen %q: %w", base, err)
	}
	resp, err := oneShotClient().Do(req)
	if err != nil {
		var cve *tls.CertificateVerificationError
		var rhe tls.RecordHeaderError
		if errors.As(err, &cve) || errors.As(err, &rhe) {
			// Something listens there, and TLS is what fails: ephemeral
			// mode would only collide with it.
			return "", fmt.Errorf("TLS with %s failed (for a cluster CA, set %s or --ca-file; for a plain HTTP queen use http://): %w", base, transport.CAFileEnv, err)
		}
		return "", fmt.Errorf("%w: %w", rpc.ErrUnreachable, err)
	}
	defer resp.Body.Close()
	var h api.Health
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if sb := standbyAnswer(resp.StatusCode, resp.Header, b); sb != nil {
		return "", sb
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &h) != nil || h.Status != "ok" {
		return "", fmt.Errorf("something answers at %s but it is not an apiary queen (GET /health: %s); point --queen or APIARY_QUEEN at a queen, or at a free address for ephemeral mode",
			base, resp.Status)
	}
	return ModePersistent, nil
}

// generate sends the prompt as a streamed chat completion and writes each
// token as it arrives.
func (k *Infer) generate(ctx context.Context, url, ref string) error {
	body := map[string]any{
		"model":    ref,
		"messages": []openai.ChatMessage{{Role: openai.RoleUser, Content: k.cfg.Prompt}},
		"stream":   true,
	}
	if k.cfg.MaxTokens > 0 {
		body["max_tokens"] = k.cfg.MaxTokens
	}
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if k.cfg.Tokens.API != "" {
		req.Header.Set("Authorization", "Bearer "+k.cfg.Tokens.API)
	}
	if k.cfg.Node != "" {
		req.Header.Set(api.PoolHeader, k.cfg.Node)
	}
	// A model the queen does not know is said at once, before any
	// "waiting for a worker of …" line.
	if err := k.checkModel(ctx, url, ref); err != nil {
		return err
	}
	prog := k.startProgress(ctx, url, ref)
	defer prog.stop()
	resp, err := oneShotClient().Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return unreachable(url, err, false)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		prog.stop()
		return answerError(resp)
	}
	return k.stream(ctx, resp.Body, prog)
}

// checkModel asks the queen whether it knows model ref (GET
// /v1/models/{ref}): a 404 model_not_found is the queen's answer, in its
// words. Any other trouble (another 404: a queen without the endpoint)
// is left to the request itself, which says it.
func (k *Infer) checkModel(ctx context.Context, url, ref string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/models/"+neturl.PathEscape(ref), nil)
	if err != nil {
		return nil
	}
	if k.cfg.Tokens.API != "" {
		req.Header.Set("Authorization", "Bearer "+k.cfg.Tokens.API)
	}
	if k.cfg.Node != "" {
		req.Header.Set(api.PoolHeader, k.cfg.Node)
	}
	resp, err := oneShotClient().Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		return nil
	}
	var ae *APIError
	if err := answerError(resp); errors.As(err, &ae) && ae.Code == openai.CodeModelNotFound {
		return err
	}
	return nil
}

// answerError reads an OpenAI error answer.
func answerError(resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return apiError(resp.StatusCode, data)
}

// stream copies the content of each SSE chunk to Stdout until [DONE].
func (k *Infer) stream(ctx context.Context, body io.Reader, prog *progress) error {
	rd := bufio.NewReaderSize(body, 64<<10)
	wrote, lastNL := false, true
	finish := func() {
		if wrote && !lastNL {
			_, _ = io.WriteString(k.cfg.Stdout, "\n")
		}
	}
	for {
		line, err := rd.ReadString('\n')
		if data, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data:"); ok {
			prog.stop()
			data = strings.TrimSpace(data)
			if data == "[DONE]" {
				finish()
				return nil
			}
			var ev struct {
				Choices []openai.ChatChunkChoice `json:"choices"`
				Error   *api.ErrorDetail         `json:"error"`
			}
			if jerr := json.Unmarshal([]byte(data), &ev); jerr != nil {
				finish()
				return fmt.Errorf("bad event in the answer stream: %w", jerr)
			}
			if ev.Error != nil {
				finish()
				return &APIError{Status: http.StatusOK, Code: ev.Error.Code, Message: "the answer broke off: " + ev.Error.Message}
			}
			for _, c := range ev.Choices {
				// Model output keeps its newlines and tabs; no other
				// control character reaches the terminal.
				if c.Delta.Content == nil {
					continue
				}
				if text := termtext.Stream(*c.Delta.Content); text != "" {
					if _, werr := io.WriteString(k.cfg.Stdout, text); werr != nil {
						return fmt.Errorf("write answer: %w", werr)
					}
					wrote, lastNL = true, strings.HasSuffix(text, "\n")
				}
			}
		}
		if err != nil {
			finish()
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			if errors.Is(err, io.EOF) {
				return errors.New("the answer stream ended before [DONE]")
			}
			return fmt.Errorf("read answer stream: %w", err)
		}
	}
}
