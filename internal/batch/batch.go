// Package batch is the OpenAI Batch API of the queen: files of requests
// (/v1/files), batches over them (/v1/batches), and the dispatcher that
// runs their requests, each a job, through the queen's routing.
//
// A batch's requests are rows in the queen's store (batch_jobs), one a
// request: queued, running on a worker, then succeeded, failed or
// cancelled with its one result line. The dispatcher takes queued jobs
// (a compare-and-set in the store: a job runs once at a time) and sends
// each through routing.Service.Serve: the same routing as an interactive
// request, at lower priority (a batch request only takes a slot no
// interactive request waits for). Waiting jobs are demand, so the
// controller may place workers for them within the model's limits; jobs
// never start workers. A job whose worker fails is tried again, up to
// MaxAttempts; after a queen restart the jobs that were running are
// queued again. When no job of a batch is queued or running, its output
// and error files are written from the job rows, each job's line once.
package batch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/apiary-llm/apiary/internal/config"
	"github.com/apiary-llm/apiary/internal/routing"
	"github.com/apiary-llm/apiary/internal/store"
)

// Defaults.
const (
	// DefaultMaxFileBytes bounds an uploaded file.
	DefaultMaxFileBytes = 100 << 20
	// DefaultFileRetention is how long files (input, output, error) and
	// ended batches are kept.
	DefaultFileRetention = 30 * 24 * time.Hour
	// DefaultMaxAttempts is how many workers a job is tried on.
	DefaultMaxAttempts = 3
	// DefaultConcurrency bounds the jobs under way (waiting for a slot or
	// running) at once.
	DefaultConcurrency = 64
	// DefaultMaxLineBytes bounds a line of an input file when the queen
	// gives no limit of its own (it gives its request body limit).
	DefaultMaxLineBytes = 1 << 20
	// DefaultMaxFiles bounds the input files kept at once.
	DefaultMaxFiles = 100
	// DefaultMaxOpenBatches bounds the batches not ended at once.
	DefaultMaxOpenBatches = 8
	// DefaultAttemptTimeout bounds one attempt of a request.
	DefaultAttemptTimeout = 10 * time.Minute
	// DefaultMaxAnswerBytes bounds the answer to one request.
	DefaultMaxAnswerBytes = 16 << 20
	// CompletionWindow is the one completion window, as OpenAI has it.
	CompletionWindow = "24h"
	completionWindow = 24 * time.Hour
	// sweepEvery is how often expired files and ended batches are removed.
	sweepEvery = time.Hour
	// resync is how often the dispatcher looks for work when nothing
	// wakes it (a model without capacity, a batch past its window).
	resync = time.Second
)

// Router is the routing the dispatcher feeds and whose authentication
// the endpoints share; routing.Service implements it.
type Router interface {
	Serve(ctx, withdraw context.Context, path string, body []byte, lim routing.BatchLimits) (routing.Answer, error)
	Handle(mux *http.ServeMux, pattern, endpoint string, fn func(w http.ResponseWriter, r *http.Request) error)
}

// Config is what the batch service needs. Zero fields take the defaults.
type Config struct {
	Store  *store.Store
	Router Router
	// Dir holds the files' bytes on SQLite (the queen's
	// <data-dir>/files); on PostgreSQL they live in the database, and Dir
	// holds only uploads and results being written (contents).
	Dir string
	// MaxFileBytes bounds an uploaded file; a larger one is refused with
	// 413; default DefaultMaxFileBytes.
	MaxFileBytes int64
	// FileRetention: files expire this long after they were made (their
	// expires_at), and ended batches with their jobs are removed this long
	// after they were created; default DefaultFileRetention; negative
	// keeps them forever.
	FileRetention time.Duration
	// MaxAttempts is how many workers a job is tried on before it fails
	// with the last one's reason; default DefaultMaxAttempts.
	MaxAttempts int
	// Concurrency bounds the jobs under way at once; default
	// DefaultConcurrency.
	Concurrency int
	// MaxLines bounds the requests of one batch (its input file's lines
	// that are not blank); default DefaultMaxLines.
	MaxLines int
	// MaxLineBytes bounds one line of an input file: the queen's request
	// body limit; default DefaultMaxLineBytes.
	MaxLineBytes int64
	// MaxFiles bounds the input files (purpose batch) kept at once; an
	// upload past it is refused with 429 until files are deleted or
	// expire; default DefaultMaxFiles. Output and error files are not
	// counted: each belongs to a batch, which MaxOpenBatches bounds.
	MaxFiles int
	// MaxOpenBatches bounds the batches not ended (validating, in
	// progress, finalizing, cancelling) at once; a creation past it is
	// refused with 429; default DefaultMaxOpenBatches.
	MaxOpenBatches int
	// AttemptTimeout bounds one attempt of a request, from the slot it
	// was given to its answer's end; past it the attempt is cancelled and
	// the request fails (attempt_timeout); default DefaultAttemptTimeout.
	AttemptTimeout time.Duration
	// MaxAnswerBytes bounds a worker's answer to one request; a larger
	// one is cut off and the request fails (answer_too_large); default
	// DefaultMaxAnswerBytes. At most Concurrency answers are held at once.
	MaxAnswerBytes int64
	Logger         *slog.Logger
}

// WithDefaults fills the zero fields.
func (c Config) WithDefaults() Config {
	config.Default(&c.MaxFileBytes, DefaultMaxFileBytes)
	config.Default(&c.FileRetention, DefaultFileRetention)
	config.Default(&c.MaxAttempts, DefaultMaxAttempts)
	config.Default(&c.Concurrency, DefaultConcurrency)
	config.Default(&c.MaxLines, DefaultMaxLines)
	config.Default(&c.MaxLineBytes, DefaultMaxLineBytes)
	config.Default(&c.MaxFiles, DefaultMaxFiles)
	config.Default(&c.MaxOpenBatches, DefaultMaxOpenBatches)
	config.Default(&c.AttemptTimeout, DefaultAttemptTimeout)
	config.Default(&c.MaxAnswerBytes, DefaultMaxAnswerBytes)
	config.Default(&c.Logger, slog.Default())
	return c
}

// Validate reports every problem with c (after defaults), by field.
func (c Config) Validate() error {
	var p config.Problems
	if c.MaxFileBytes < 1 {
		p.Add("MaxFileBytes", "must be positive, got %d", c.MaxFileBytes)
	}
	if c.FileRetention > 0 && c.FileRetention < time.Minute {
		p.Add("FileRetention", "%s is shorter than a minute: give at least 1m, or a negative value to keep forever", c.FileRetention)
	}
	if c.MaxAttempts < 1 {
		p.Add("MaxAttempts", "must be at least 1, got %d", c.MaxAttempts)
	}
	if c.Concurrency < 1 {
		p.Add("Concurrency", "must be at least 1, got %d", c.Concurrency)
	}
	if c.MaxLines < 1 {
		p.Add("MaxLines", "must be at least 1, got %d", c.MaxLines)
	}
	if c.MaxLineBytes < 64 || c.MaxLineBytes > 1<<30 {
		p.Add("MaxLineBytes", "must be from 64 bytes to 1 GiB, got %d", c.MaxLineBytes)
	}
	if c.MaxFiles < 1 {
		p.Add("MaxFiles", "must be at least 1, got %d", c.MaxFiles)
	}
	if c.MaxOpenBatches < 1 {
		p.Add("MaxOpenBatches", "must be at least 1, got %d", c.MaxOpenBatches)
	}
	if c.AttemptTimeout <= 0 {
		p.Add("AttemptTimeout", "must be positive, got %s", c.AttemptTimeout)
	}
	if c.MaxAnswerBytes < 1<<10 {
		p.Add("MaxAnswerBytes", "must be at least 1024, got %d", c.MaxAnswerBytes)
	}
	return p.Err()
}

// Service is the Batch API of one queen. Create it with New, serve its
// Routes, and run its dispatcher with Run.
type Service struct {
	cfg   Config
	st    *store.Store
	files contents
	log   *slog.Logger
	wake  chan struct{} // buffered 1: work may be waiting
	// cancelled carries the batches just cancelled, for the dispatcher to
	// finish at once those with no job running (buffered; a full channel
	// leaves it to the hourly sweep).
	cancelled chan string
	done      chan jobDone // the dispatcher's jobs report here
	ends      chan *jobEnd // the jobs' ends, to the writer
	// recovered is closed once Run has cleaned up after the queen's last
	// end (batches whose creation it cut short removed): creations wait
	// for it, so that the clean-up never takes a batch this queen is
	// creating for a client that will be answered 200.
	recovered   chan struct{}
	recoverOnce sync.Once
	recoverErr  error // why the clean-up failed; set before recovered is closed

	mu sync.Mutex
	// withdrawals holds, by batch with jobs under way, what takes those
	// still waiting for a slot out of the routing's queue when the batch
	// is cancelled or expires: they have not begun, and they end at once
	// (cancelled or failed) instead of running to their end.
	withdrawals map[string]*withdrawal
	// withdrawn holds the batches cancelled or expired until they end, so
	// that a job taken just before gets an ended withdrawal too (at most
	// the batches not ended, bounded by MaxOpenBatches).
	withdrawn map[string]bool
}

type withdrawal struct {
	ctx    context.Context
	cancel context.CancelFunc
	jobs   int // under way with ctx
}

// withdrawalOf is the withdrawal of batch id for a job starting; the job
// calls done when it ended.
func (s *Service) withdrawalOf(id string) (_ context.Context, done func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.withdrawals[id]
	if w == nil {
		ctx, cancel := context.WithCancel(context.Background())
		w = &withdrawal{ctx: ctx, cancel: cancel}
		if s.withdrawn[id] {
			cancel()
		} else {
			s.withdrawals[id] = w
		}
	}
	w.jobs++
	return w.ctx, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if w.jobs--; w.jobs == 0 && s.withdrawals[id] == w {
			w.cancel()
			delete(s.withdrawals, id)
		}
	}
}

// withdraw takes batch id's jobs out of the routing: those that wait for
// a slot leave the queue, those that run are cancelled at their worker.
func (s *Service) withdraw(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.withdrawn[id] = true
	if w := s.withdrawals[id]; w != nil {
		w.cancel()
		delete(s.withdrawals, id)
	}
}

// ended forgets a batch that ended.
func (s *Service) ended(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.withdrawn, id)
}

// New checks cfg and builds the service.
func New(cfg Config) (*Service, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Store == nil || cfg.Router == nil || cfg.Dir == "" {
		return nil, fmt.Errorf("Config.Store, Router and Dir are required")
	}
	files := contents{dir: cfg.Dir, st: cfg.Store, inDB: cfg.Store.Dialect() == store.Postgres}
	return &Service{cfg: cfg, st: cfg.Store, files: files, log: cfg.Logger.With("component", "batch"),
		wake: make(chan struct{}, 1), recovered: make(chan struct{}), cancelled: make(chan string, 64), done: make(chan jobDone), ends: make(chan *jobEnd), withdrawals: map[string]*withdrawal{}, withdrawn: map[string]bool{}}, nil
}

// signal wakes the dispatcher; it never blocks.
func (s *Service) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// newID is prefix, then the time in microseconds (ids sort by creation)
// and 8 random bytes, in hex.
func newID(prefix string, now time.Time) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s%013x%s", prefix, now.UnixMicro(), hex.EncodeToString(b[:]))
}

// Actor is the audit actor of what a client of the API asks.
const Actor = "api"
