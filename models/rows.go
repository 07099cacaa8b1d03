package models

import (
	"github.com/google/uuid"
	"github.com/zndraw/joblib/internal/taskstatus"
)

// User is an account that owns workers and providers and submits tasks.
type User struct {
	ID          uuid.UUID
	Name        string
	Email       *string
	IsActive    bool
	IsSuperuser bool
	CreatedAt   Time
}

// Worker is one worker process's registration.
type Worker struct {
	ID            uuid.UUID
	UserID        uuid.UUID
	LastHeartbeat Time
	CreatedAt     Time
	SessionEpoch  int64
	NodeID        *string
	NodeRun       *string
	BoundAt       Time
	// JobCount is filled by listings: the number of the worker's job links.
	JobCount int64
}

// Job is a registered job type in a room. Jobs are soft-deleted, never removed.
type Job struct {
	ID           uuid.UUID
	Seq          int64
	RoomID       string
	Category     string
	Name         string
	Schema       string
	Deleted      bool
	OnWorkerLoss string
	MaxAttempts  int
	// CreatedByID is the user who registered the job (nil for jobs from
	// before creators were recorded, and internal jobs); its worker-loss
	// policy is theirs to change.
	CreatedByID *uuid.UUID
	CreatedAt   Time
	// TaskTimeout and HeartbeatTimeout are the job's task limits in
	// seconds (nil: none); OnTimeout is what a task past one becomes:
	// "fail" or "requeue" (while MaxAttempts allows).
	TaskTimeout      *int
	HeartbeatTimeout *int
	OnTimeout        string
	// RetryBackoff and RetryMaxBackoff (seconds) are the job's retry
	// policy: a failed report puts the task back to pending after
	// min(RetryMaxBackoff, RetryBackoff × 2^(attempt-1)) while MaxAttempts
	// allows. nil RetryBackoff: a failed report is final.
	RetryBackoff    *float64
	RetryMaxBackoff *float64
}

// FullName is room:category:name.
func (j Job) FullName() string { return j.RoomID + ":" + j.Category + ":" + j.Name }

// Task is one submitted unit of work, joined with what the API shows of its job.
type Task struct {
	ID           uuid.UUID
	Seq          int64
	JobID        uuid.UUID
	WorkerID     *uuid.UUID
	LostWorkerID *uuid.UUID
	RoomID       string
	CreatedByID  *uuid.UUID
	Payload      string
	Status       string
	Attempt      int
	CreatedAt    Time
	ClaimedAt    Time
	StartedAt    Time
	CompletedAt  Time
	Error        *string
	// Result is the JSON result an internal job stored (nil otherwise).
	Result *string

	// Joined from the task's job (the job may be soft-deleted).
	JobRoom       *string
	JobCategory   *string
	JobName       *string
	OnWorkerLoss  *string
	MaxAttempts   *int
	QueuePosition *int64

	// The task's limits in seconds (copied from its job at submission; a
	// submission may set its own TaskTimeout), and the deadline a claim
	// and each progress report compute from them on the database clock.
	TaskTimeout      *int
	HeartbeatTimeout *int
	DeadlineAt       Time
	// The last progress its worker reported, and when (database clock).
	ProgressCurrent *float64
	ProgressTotal   *float64
	ProgressMessage *string
	ProgressAt      Time
	// OnTimeout is the job's timeout policy (joined like OnWorkerLoss).
	OnTimeout *string

	// Priority orders claims (higher first, then seq). RunAt is when the
	// task may be claimed from (NULL: at once); Delayed is true while it
	// waits for RunAt (the leader clears it, see PromoteDueTasks). Errors
	// is the JSON array of its failed attempts' errors (the last
	// MaxAttemptErrors).
	Priority int
	RunAt    Time
	Delayed  bool
	Errors   *string
	// The job's retry policy (joined like OnWorkerLoss).
	RetryBackoff    *float64
	RetryMaxBackoff *float64
}

// JobFullName is the job's full name, or "" when the job row is missing.
func (t Task) JobFullName() string {
	if t.JobRoom == nil || t.JobCategory == nil || t.JobName == nil {
		return ""
	}
	return *t.JobRoom + ":" + *t.JobCategory + ":" + *t.JobName
}

// Provider is a data provider served by one worker.
type Provider struct {
	ID          uuid.UUID
	Seq         int64
	RoomID      string
	Category    string
	Name        string
	Schema      string
	ContentType string
	UserID      uuid.UUID
	WorkerID    uuid.UUID
	CreatedAt   Time
}

// FullName is room:category:name.
func (p Provider) FullName() string { return p.RoomID + ":" + p.Category + ":" + p.Name }

// Task statuses as stored and as the API shows them: the vocabulary is
// taskstatus's, named here for the queries that write them.
const (
	StatusPending   = taskstatus.Pending
	StatusClaimed   = taskstatus.Claimed
	StatusRunning   = taskstatus.Running
	StatusCompleted = taskstatus.Completed
	StatusFailed    = taskstatus.Failed
	StatusCancelled = taskstatus.Cancelled
)

// Page is limit/offset pagination.
type Page struct {
	Limit  int
	Offset int
}
