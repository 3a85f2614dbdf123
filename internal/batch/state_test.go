package batch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/openai"
	"github.com/apiary-llm/apiary/internal/routing"
	"github.com/apiary-llm/apiary/internal/store"
)

func TestJobMoves(t *testing.T) {
	all := []JobState{JobQueued, JobRunning, JobSucceeded, JobFailed, JobCancelled}
	allowed := map[[2]JobState]bool{
		{JobQueued, JobRunning}: true, {JobQueued, JobCancelled}: true, {JobQueued, JobFailed}: true,
		{JobRunning, JobSucceeded}: true, {JobRunning, JobFailed}: true, {JobRunning, JobQueued}: true, {JobRunning, JobCancelled}: true,
	}
	for _, from := range all {
		for _, to := range all {
			err := CheckJobMove(from, to)
			if (err == nil) != allowed[[2]JobState{from, to}] {
				t.Errorf("%s → %s: %v", from, to, err)
			}
		}
	}
	for _, s := range all {
		if s.Terminal() != (s == JobSucceeded || s == JobFailed || s == JobCancelled) {
			t.Errorf("%s.Terminal() = %v", s, s.Terminal())
		}
	}
}

func TestBatchMoves(t *testing.T) {
	all := []Status{StatusValidating, StatusInProgress, StatusFinalizing, StatusCompleted, StatusFailed, StatusCancelling, StatusCancelled, StatusExpired}
	allowed := map[[2]Status]bool{
		{StatusValidating, StatusInProgress}: true, {StatusValidating, StatusFailed}: true,
		{StatusInProgress, StatusFinalizing}: true, {StatusInProgress, StatusCancelling}: true,
		{StatusFinalizing, StatusCompleted}: true, {StatusFinalizing, StatusExpired}: true, {StatusFinalizing, StatusFailed}: true,
		{StatusCancelling, StatusCancelled}: true,
	}
	for _, from := range all {
		for _, to := range all {
			if err := CheckMove(from, to); (err == nil) != allowed[[2]Status{from, to}] {
				t.Errorf("%s → %s: %v", from, to, err)
			}
		}
	}
	for _, tc := range []struct {
		from    Status
		expired bool
		want    Status
	}{{StatusFinalizing, false, StatusCompleted}, {StatusFinalizing, true, StatusExpired}, {StatusCancelling, false, StatusCancelled}, {StatusCancelling, true, StatusCancelled}} {
		if got := endOf(tc.from, tc.expired); got != tc.want {
			t.Errorf("endOf(%s, %v) = %s, want %s", tc.from, tc.expired, got, tc.want)
		}
	}
}

// decide: what one attempt makes of a job.
func TestDecide(t *testing.T) {
	job := store.BatchJob{BatchID: "batch_1", Line: 4, CustomID: "c4", ModelRef: "tiny", State: string(JobRunning), Attempts: 1}
	lastTry := job
	lastTry.Attempts = 3
	workerDied := &routing.AttemptError{LifecycleID: "wk-2", Err: errors.New("connection reset")}
	for _, tc := range []struct {
		name      string
		job       store.BatchJob
		ans       routing.Answer
		err       error
		stopping  bool
		state     JobState
		attempts  int
		pause     bool
		resultHas string // "" : no result line
	}{
		{"served", job, routing.Answer{Status: 200, Body: []byte(`{"id":"x"}`), LifecycleID: "wk-1"}, nil, false, JobSucceeded, 1, false, `"custom_id":"c4","response":{"status_code":200`},
		{"the worker's 400", job, routing.Answer{Status: 400, Body: []byte(`{"error":{}}`), LifecycleID: "wk-1"}, nil, false, JobFailed, 1, false, `"status_code":400`},
		{"worker died, attempts left", job, routing.Answer{}, workerDied, false, JobQueued, 1, false, ""},
		{"worker died on the last attempt", lastTry, routing.Answer{}, workerDied, false, JobFailed, 3, false, `"code":"worker_failed","message":"the request failed on 3 attempts`},
		{"unknown model", job, routing.Answer{}, fmt.Errorf("%w: no pool has model", routing.ErrModelNotFound), false, JobFailed, 1, false, `"code":"model_not_found"`},
		{"no capacity now", job, routing.Answer{}, routing.ErrNoCapacity, false, JobQueued, 0, true, ""},
		{"shutting down", job, routing.Answer{}, routing.ErrShuttingDown, false, JobQueued, 0, true, ""},
		{"the queen stops", job, routing.Answer{}, errors.New("context canceled"), true, JobQueued, 0, false, ""},
		{"past the attempt's deadline", job, routing.Answer{}, &routing.LimitError{LifecycleID: "wk-1", Err: routing.ErrAttemptTimeout}, false, JobFailed, 1, false,
			`"code":"attempt_timeout","message":"the request ran past the queen's limit of 10m0s an attempt (--batch-attempt-timeout) on worker wk-1`},
		{"an answer past the bound", job, routing.Answer{}, &routing.LimitError{LifecycleID: "wk-1", Err: routing.ErrAnswerTooLarge}, false, JobFailed, 1, false,
			`"code":"answer_too_large","message":"worker wk-1's answer is larger than the queen's limit of 16777216 bytes (--batch-max-answer-bytes)`},
		{"withdrawn while it ran", job, routing.Answer{}, fmt.Errorf("%w: %w", routing.ErrWithdrawn, context.Canceled), false, JobQueued, 0, false, ""},
		{"invalid body", job, routing.Answer{}, &openai.Error{Status: http.StatusBadRequest, Code: "invalid_value", Message: "bad"}, false, JobFailed, 1, false, `"code":"invalid_value"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next, pause := decide(tc.job, tc.ans, tc.err, tc.stopping, Config{MaxAttempts: 3}.WithDefaults())
			if JobState(next.State) != tc.state || next.Attempts != tc.attempts || (pause > 0) != tc.pause {
				t.Fatalf("got %s, %d attempts, pause %s; want %s, %d, pause %v", next.State, next.Attempts, pause, tc.state, tc.attempts, tc.pause)
			}
			if err := CheckJobMove(JobRunning, JobState(next.State)); err != nil {
				t.Fatal(err)
			}
			if (next.Result == "") != (tc.resultHas == "") || !strings.Contains(next.Result, tc.resultHas) {
				t.Fatalf("result %q, want it to hold %q", next.Result, tc.resultHas)
			}
		})
	}
	if _, pause := decide(job, routing.Answer{}, &openai.CodedError{Status: 503, Code: "no_capacity", Retry: 7 * time.Second}, false, Config{MaxAttempts: 3}.WithDefaults()); pause != 7*time.Second {
		t.Errorf("pause %s, want the error's Retry-After 7s", pause)
	}
}

// fairShares: the places go to the batches with the fewest jobs under
// way first, the oldest first among equals, none to a batch out of the
// round.
func TestFairShares(t *testing.T) {
	for _, tc := range []struct {
		name  string
		free  int
		under []int
		open  []bool
		want  []int
	}{
		{"one batch takes all", 8, []int{0}, []bool{true}, []int{8}},
		{"two new batches split", 8, []int{0, 0}, []bool{true, true}, []int{4, 4}},
		{"odd: the oldest gets the extra", 5, []int{0, 0}, []bool{true, true}, []int{3, 2}},
		{"a new batch catches up first", 4, []int{62, 0}, []bool{true, true}, []int{0, 4}},
		{"then both grow", 10, []int{6, 0}, []bool{true, true}, []int{2, 8}},
		{"a batch out of the round gets none", 6, []int{0, 0, 0}, []bool{true, false, true}, []int{3, 0, 3}},
		{"none open", 3, []int{1, 2}, []bool{false, false}, []int{0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fairShares(tc.free, tc.under, tc.open); !slices.Equal(got, tc.want) {
				t.Fatalf("fairShares(%d, %v, %v) = %v, want %v", tc.free, tc.under, tc.open, got, tc.want)
			}
		})
	}
}
