package procs

import (
	"bytes"
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// Waits that must not run out in a passing test are an hour; the test's
// context (stopLimit) ends them when the escalation is wrong, and Stop
// then reports PhaseKill and the context's error.
const stopLimit = 30 * time.Second

func TestEscalationSteps(t *testing.T) {
	ask := func(context.Context) error { return nil }
	e := Escalation{Ask: ask, AskWait: 10 * time.Second, TermWait: 3 * time.Second}
	noAsk := Escalation{AskWait: 10 * time.Second, TermWait: 3 * time.Second}
	tests := []struct {
		name string
		got  Step
		want Step
	}{
		{"begins with the ask", e.First(), Step{Phase: PhaseAsk, Wait: 10 * time.Second}},
		{"without Ask begins with SIGTERM", noAsk.First(), Step{Phase: PhaseTerm, Wait: 3 * time.Second}},
		{"nothing sent yet begins", e.After(PhaseNone, 0), Step{Phase: PhaseAsk, Wait: 10 * time.Second}},
		{"ask ran out: SIGTERM", e.After(PhaseAsk, 0), Step{Phase: PhaseTerm, Wait: 3 * time.Second}},
		{"ask failed early: SIGTERM keeps the rest of the ask's wait", e.After(PhaseAsk, 7*time.Second), Step{Phase: PhaseTerm, Wait: 7 * time.Second}},
		{"ask failed late: SIGTERM waits its own", e.After(PhaseAsk, time.Second), Step{Phase: PhaseTerm, Wait: 3 * time.Second}},
		{"SIGTERM ran out: SIGKILL", e.After(PhaseTerm, 0), Step{Phase: PhaseKill}},
		{"SIGKILL stays", e.After(PhaseKill, 0), Step{Phase: PhaseKill}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, tt.got); diff != "" {
			t.Errorf("%s (-want +got)\n%s", tt.name, diff)
		}
	}
}

// readyWriter closes ready when the child has printed "ready": its signal
// handling is set up.
type readyWriter struct {
	mu    sync.Mutex
	b     bytes.Buffer
	once  sync.Once
	ready chan struct{}
}

func (w *readyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b.Write(p)
	if bytes.Contains(w.b.Bytes(), []byte("ready\n")) {
		w.once.Do(func() { close(w.ready) })
	}
	return len(p), nil
}

// startReady starts a child and waits until it says it is ready.
func startReady(t *testing.T, sp *Spawner, behaviour string, stdin *os.File) *Process {
	t.Helper()
	out := &readyWriter{ready: make(chan struct{})}
	p, err := sp.Start(t.Context(), Spec{Path: os.Args[0], Env: append(os.Environ(), "PROCS_CHILD="+behaviour),
		Output: out, Stdin: stdin})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-out.ready:
	case <-p.Done():
		t.Fatalf("child %s exited before it was ready: %v", behaviour, p.Exit())
	}
	return p
}

func stopCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), stopLimit)
	t.Cleanup(cancel)
	return ctx
}

func checkStop(t *testing.T, p *Process, phase, want Phase, err error, exit Exit) {
	t.Helper()
	<-p.Done()
	if phase != want || err != nil {
		t.Errorf("Stop = %v, %v; want %v, nil", phase, err, want)
	}
	if got := p.Exit(); got != exit {
		t.Errorf("exit = %v, want %v", got, exit)
	}
}

func TestStopEndsOnAsk(t *testing.T) {
	sp := NewSpawner()
	defer sp.Close()
	line, err := NewLifeline(nil)
	if err != nil {
		t.Fatal(err)
	}
	p := startReady(t, sp, "lifeline", line.Child)
	line.CloseChildEnd()
	var askReturned atomic.Bool
	phase, err := Stop(stopCtx(t), p, Escalation{
		Ask: func(ctx context.Context) error {
			// Cut the lifeline, then hold on until Stop ends the ask: the
			// process is gone.
			line.Cut()
			<-ctx.Done()
			askReturned.Store(true)
			return ctx.Err()
		},
		AskWait: time.Hour, TermWait: time.Hour,
	})
	checkStop(t, p, phase, PhaseAsk, err, Exit{Code: 0})
	if !askReturned.Load() {
		t.Error("Stop returned before its Ask did")
	}
}

func TestStopSIGTERMAfterAskWait(t *testing.T) {
	sp := NewSpawner()
	defer sp.Close()
	p := startChild(t, sp, "sleep", nil)
	// An ask the process does not act on, answered only when its phase
	// runs out: no error, SIGTERM.
	phase, err := Stop(stopCtx(t), p, Escalation{
		Ask:     func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() },
		AskWait: 20 * time.Millisecond, TermWait: time.Hour,
	})
	checkStop(t, p, phase, PhaseTerm, err, Exit{Code: -1, Signal: syscall.SIGTERM})
}

func TestStopSIGKILLAfterTermWait(t *testing.T) {
	sp := NewSpawner()
	defer sp.Close()
	p := startReady(t, sp, "ignore-term", nil)
	phase, err := Stop(stopCtx(t), p, Escalation{
		Ask:     func(context.Context) error { return nil },
		AskWait: 10 * time.Millisecond, TermWait: 10 * time.Millisecond,
	})
	checkStop(t, p, phase, PhaseKill, err, Exit{Code: -1, Signal: syscall.SIGKILL})
}

func TestStopFailedAskSendsSIGTERMAtOnce(t *testing.T) {
	sp := NewSpawner()
	defer sp.Close()
	p := startChild(t, sp, "sleep", nil)
	refused := errors.New("refused")
	phase, err := Stop(stopCtx(t), p, Escalation{
		Ask:     func(context.Context) error { return refused },
		AskWait: time.Hour, TermWait: time.Hour,
	})
	<-p.Done()
	if phase != PhaseTerm || !errors.Is(err, refused) {
		t.Errorf("Stop = %v, %v; want SIGTERM and the ask's error", phase, err)
	}
	if got := p.Exit(); got.Signal != syscall.SIGTERM {
		t.Errorf("exit = %v, want SIGTERM", got)
	}
}

func TestStopWithoutAskBeginsWithSIGTERM(t *testing.T) {
	sp := NewSpawner()
	defer sp.Close()
	p := startChild(t, sp, "sleep", nil)
	phase, err := Stop(stopCtx(t), p, Escalation{AskWait: time.Hour, TermWait: time.Hour})
	checkStop(t, p, phase, PhaseTerm, err, Exit{Code: -1, Signal: syscall.SIGTERM})
}

func TestStopEndedContextKillsAtOnce(t *testing.T) {
	sp := NewSpawner()
	defer sp.Close()
	p := startReady(t, sp, "ignore-term", nil)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	var askReturned atomic.Bool
	phase, err := Stop(ctx, p, Escalation{
		Ask:     func(ctx context.Context) error { <-ctx.Done(); askReturned.Store(true); return nil },
		AskWait: time.Hour, TermWait: time.Hour,
	})
	<-p.Done()
	if phase != PhaseKill || !errors.Is(err, context.Canceled) {
		t.Errorf("Stop = %v, %v; want SIGKILL and context.Canceled", phase, err)
	}
	if got := p.Exit(); got.Signal != syscall.SIGKILL {
		t.Errorf("exit = %v, want SIGKILL", got)
	}
	if !askReturned.Load() {
		t.Error("Stop returned before its Ask did")
	}
}

func TestStopGoneAlready(t *testing.T) {
	sp := NewSpawner()
	defer sp.Close()
	p := startChild(t, sp, "exit3", nil)
	<-p.Done()
	phase, err := Stop(stopCtx(t), p, Escalation{
		Ask:     func(context.Context) error { t.Error("asked a process that is gone"); return nil },
		AskWait: time.Hour, TermWait: time.Hour,
	})
	if phase != PhaseNone || err != nil {
		t.Errorf("Stop = %v, %v; want none", phase, err)
	}
}
