package procs

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"
)

// Stopping a process is one escalation, the same for every daemon: ask it
// to stop (an HTTP shutdown, closing its lifeline), then SIGTERM to its
// group, then SIGKILL, each phase waiting for the process to be gone
// before the next. Stop drives it for a caller that may block; a
// supervision loop that must go on serving other events drives the same
// steps (Escalation.After) from its own timers.

// Phase is how far a stop escalated.
type Phase int

const (
	PhaseNone Phase = iota // the process was gone before anything was sent
	PhaseAsk               // asked (Escalation.Ask)
	PhaseTerm              // SIGTERM sent to the group
	PhaseKill              // SIGKILL sent to the group
)

func (p Phase) String() string {
	switch p {
	case PhaseNone:
		return "none"
	case PhaseAsk:
		return "ask"
	case PhaseTerm:
		return "SIGTERM"
	case PhaseKill:
		return "SIGKILL"
	}
	return fmt.Sprintf("Phase(%d)", int(p))
}

// Target is a process Stop can stop; *Process is one.
type Target interface {
	Signal(sig syscall.Signal) error // to the whole group
	Kill()                           // SIGKILL to the whole group
	Exited() <-chan struct{}         // closed once the process is reaped
}

// Escalation says how a process is stopped.
type Escalation struct {
	// Ask asks the process to stop. Nil: the escalation begins with
	// SIGTERM. Its context ends with the ask phase (AskWait) or when the
	// process is gone; Ask must return then. An error from Ask ends the
	// ask phase at once.
	Ask func(ctx context.Context) error
	// AskWait is how long the process has to exit after Ask is called.
	AskWait time.Duration
	// TermWait is how long the process has to exit after SIGTERM before
	// SIGKILL. After a failed Ask it is at least what was left of AskWait:
	// a refused ask does not shorten the time the process is given.
	TermWait time.Duration
}

// Step is one phase of an escalation: what is done on entering it (call
// Ask, send SIGTERM, send SIGKILL) and how long to wait there for the
// process to be gone. After SIGKILL the wait is until it is gone.
type Step struct {
	Phase Phase
	Wait  time.Duration // zero for PhaseKill
}

// First is the step an escalation begins with.
func (e Escalation) First() Step {
	if e.Ask == nil {
		return Step{Phase: PhaseTerm, Wait: e.TermWait}
	}
	return Step{Phase: PhaseAsk, Wait: e.AskWait}
}

// After is the step that follows phase p once it ended with `left` of its
// wait unused: zero when the wait ran out, more when the ask failed early.
func (e Escalation) After(p Phase, left time.Duration) Step {
	switch p {
	case PhaseNone:
		return e.First()
	case PhaseAsk:
		return Step{Phase: PhaseTerm, Wait: max(e.TermWait, left)}
	}
	return Step{Phase: PhaseKill}
}

// Stop escalates until p is gone and returns the phase that ended it. It
// returns only once p is gone: when ctx ends first, p gets SIGKILL at
// once and Stop waits for it, returning ctx's error with PhaseKill. The
// error also reports a failed Ask and a signal that could not be sent.
func Stop(ctx context.Context, p Target, e Escalation) (Phase, error) {
	select {
	case <-p.Exited():
		return PhaseNone, nil
	default:
	}
	var (
		errs    []error
		step    Step
		ends    time.Time  // when step's wait runs out
		asked   chan error // receives Ask's result; nil when none is pending
		stopAsk = func() {}
		timer   = time.NewTimer(time.Hour)
	)
	defer func() {
		stopAsk()
		if asked != nil {
			<-asked
		}
		timer.Stop()
	}()
	enter := func(s Step) {
		step, ends = s, time.Now().Add(s.Wait)
		switch s.Phase {
		case PhaseAsk:
			askCtx, cancel := context.WithDeadline(ctx, ends)
			stopAsk = cancel
			asked = make(chan error, 1)
			go func() { asked <- e.Ask(askCtx) }()
		case PhaseTerm:
			if err := p.Signal(syscall.SIGTERM); err != nil {
				errs = append(errs, err)
			}
		case PhaseKill:
			timer.Stop()
			p.Kill()
			return
		}
		timer.Reset(s.Wait)
	}
	enter(e.First())
	for {
		// After SIGKILL only the process's end is awaited.
		expired, cancelled := timer.C, ctx.Done()
		if step.Phase == PhaseKill {
			expired, cancelled = nil, nil
		}
		select {
		case <-p.Exited():
			return step.Phase, errors.Join(errs...)
		case err := <-asked:
			asked = nil
			// An answer after the phase ran out (its context ended) is
			// the timer's or ctx's to act on.
			if err != nil && step.Phase == PhaseAsk && time.Now().Before(ends) && ctx.Err() == nil {
				errs = append(errs, fmt.Errorf("ask to stop: %w", err))
				enter(e.After(PhaseAsk, time.Until(ends)))
			}
		case <-expired:
			enter(e.After(step.Phase, 0))
		case <-cancelled:
			errs = append(errs, ctx.Err())
			enter(Step{Phase: PhaseKill})
		}
	}
}
