package keeper

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/apiary-llm/apiary/internal/termtext"
)

// progress shows, on stderr, what the keeper waits for until the first
// token arrives: a worker of the model being placed and loaded. On a
// terminal it rewrites one line; otherwise it prints a line per change.
type progress struct {
	w        io.Writer
	terminal bool
	cancel   context.CancelFunc
	done     chan struct{}
	once     sync.Once
}

// progressTick is how often the line is refreshed, and progressPoll how
// often the queen is asked about the model's workers.
const (
	progressTick = 250 * time.Millisecond
	progressPoll = time.Second
)

func (k *Infer) startProgress(ctx context.Context, url, ref string) *progress {
	ctx, cancel := context.WithCancel(ctx)
	p := &progress{w: k.cfg.Stderr, terminal: k.cfg.Terminal, cancel: cancel, done: make(chan struct{})}
	c := NewClient(url, k.cfg.Tokens.Admin, k.cfg.Tokens.Cluster)
	c.SetTimeout(progressPoll)
	go p.run(ctx, c, ref)
	return p
}

func (p *progress) run(ctx context.Context, c *Client, ref string) {
	defer close(p.done)
	start := time.Now()
	tick := time.NewTicker(progressTick)
	defer tick.Stop()
	state, last, shown := "waiting for a worker of "+ref, "", false
	var polled time.Time
	for {
		if time.Since(polled) >= progressPoll {
			polled = time.Now()
			state = workerState(ctx, c, ref, state)
		}
		line := termtext.Line(state) // it names the queen's pools: printable text only
		switch {
		case p.terminal:
			fmt.Fprintf(p.w, "\r\033[K%s… %s", line, time.Since(start).Truncate(time.Second))
			shown = true
		case state != last:
			fmt.Fprintf(p.w, "%s…\n", line)
		}
		last = state
		select {
		case <-ctx.Done():
			if shown {
				fmt.Fprint(p.w, "\r\033[K")
			}
			return
		case <-tick.C:
		}
	}
}

// workerState names what the queen's rows say about the model: a worker
// loading, or none yet. Without the admin token it keeps the old state.
func workerState(ctx context.Context, c *Client, ref, old string) string {
	rows, err := c.Workers(ctx, WorkerFilter{Model: ref, Status: "STARTING,RUNNING", Limit: 10})
	if err != nil {
		return old
	}
	for _, r := range rows {
		if r.Status == "RUNNING" {
			return ref + " ready on pool " + r.PoolID + ", waiting for the answer"
		}
	}
	for _, r := range rows {
		if r.Status == "STARTING" {
			return "loading " + ref + " on pool " + r.PoolID
		}
	}
	return "waiting for a worker of " + ref
}

// stop ends the progress line (clearing it on a terminal); idempotent.
func (p *progress) stop() {
	p.once.Do(func() {
		p.cancel()
		<-p.done
	})
}
