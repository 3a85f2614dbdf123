package batch

import "fmt"

// JobState is where one request of a batch (a job) is.
type JobState string

// Job states: queued → running → succeeded | failed | cancelled; running
// → queued when its worker failed and it has attempts left, or when the
// queen restarted while it ran; queued → cancelled (the batch was
// cancelled) or failed (the batch expired).
const (
	JobQueued    JobState = "queued"
	JobRunning   JobState = "running"
	JobSucceeded JobState = "succeeded"
	JobFailed    JobState = "failed"
	JobCancelled JobState = "cancelled"
)

var jobMoves = map[JobState][]JobState{
	JobQueued:  {JobRunning, JobCancelled, JobFailed},
	JobRunning: {JobSucceeded, JobFailed, JobQueued, JobCancelled},
}

// Terminal reports whether s is an end: the job has its result line.
func (s JobState) Terminal() bool { return len(jobMoves[s]) == 0 }

// CheckJobMove returns an error unless a job may go from one state to
// the other.
func CheckJobMove(from, to JobState) error {
	for _, s := range jobMoves[from] {
		if s == to {
			return nil
		}
	}
	return fmt.Errorf("a job cannot go from %s to %s", from, to)
}

// Status is a batch's status, as OpenAI names it.
type Status string

// Batch statuses: validating → in_progress → finalizing → completed;
// validating → failed (its input is refused); in_progress → cancelling
// → cancelled (its queued requests are cancelled, those running finish,
// then the partial results are written); finalizing → expired (the
// completion window passed while it was in progress: its queued
// requests failed with batch_expired, the rest are written).
const (
	StatusValidating Status = "validating"
	StatusInProgress Status = "in_progress"
	StatusFinalizing Status = "finalizing"
	StatusCompleted  Status = "completed"
	StatusFailed     Status = "failed"
	StatusCancelling Status = "cancelling"
	StatusCancelled  Status = "cancelled"
	StatusExpired    Status = "expired"
)

var statusMoves = map[Status][]Status{
	StatusValidating: {StatusInProgress, StatusFailed},
	StatusInProgress: {StatusFinalizing, StatusCancelling},
	StatusFinalizing: {StatusCompleted, StatusExpired, StatusFailed},
	StatusCancelling: {StatusCancelled},
}

// Terminal reports whether s is an end.
func (s Status) Terminal() bool { return len(statusMoves[s]) == 0 }

// CheckMove returns an error unless a batch may go from one status to
// the other.
func CheckMove(from, to Status) error {
	for _, s := range statusMoves[from] {
		if s == to {
			return nil
		}
	}
	return fmt.Errorf("a batch cannot go from %s to %s", from, to)
}

// Counts is a batch's requests by how they ended.
type Counts struct {
	Total, Completed, Failed int
	Queued, Running          int // not ended yet
	Cancelled                int
}

// countJobs turns the store's counts by state into Counts. Cancelled
// requests count as failed in OpenAI's request_counts (they are in the
// error file).
func countJobs(total int, byState map[string]int) Counts {
	return Counts{Total: total, Completed: byState[string(JobSucceeded)], Failed: byState[string(JobFailed)] + byState[string(JobCancelled)],
		Queued: byState[string(JobQueued)], Running: byState[string(JobRunning)], Cancelled: byState[string(JobCancelled)]}
}

// Settled reports whether no request is queued or running.
func (c Counts) Settled() bool { return c.Queued == 0 && c.Running == 0 }

// endOf is the status a batch ends in once its requests settled and its
// files are written: cancelling ends cancelled, and a batch that
// finalized ends expired when its completion window passed, else
// completed.
func endOf(from Status, expired bool) Status {
	switch {
	case from == StatusCancelling:
		return StatusCancelled
	case expired:
		return StatusExpired
	}
	return StatusCompleted
}
