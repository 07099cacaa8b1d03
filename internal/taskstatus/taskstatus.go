// Package taskstatus is the task status vocabulary: the six statuses (as
// stored and as the API and events show them), which of them are final, and
// the transitions between them (contract §3.1). It imports no joblib package, so models
// (which stores statuses), events and joblib (which enforces the state
// machine) share one list.
package taskstatus

import "slices"

// The task statuses. The strings are the wire's and the database's.
const (
	Pending   = "pending"
	Claimed   = "claimed"
	Running   = "running"
	Completed = "completed"
	Failed    = "failed"
	Cancelled = "cancelled"
)

// All are the statuses in the order a task may pass through them.
var All = []string{Pending, Claimed, Running, Completed, Failed, Cancelled}

// transitions is the task state machine; anything else, including a
// transition to the same status, is refused.
var transitions = map[string][]string{
	Pending: {Claimed, Cancelled},
	Claimed: {Running, Failed, Cancelled},
	Running: {Completed, Failed, Cancelled},
}

// Valid reports whether s is one of the six statuses.
func Valid(s string) bool {
	switch s {
	case Pending, Claimed, Running, Completed, Failed, Cancelled:
		return true
	}
	return false
}

// Terminal reports whether a status is final: no transition leaves it.
func Terminal(s string) bool {
	return s == Completed || s == Failed || s == Cancelled
}

// Next lists the statuses a task may move to from the given one.
func Next(from string) []string { return slices.Clone(transitions[from]) }

// Allowed reports whether a task may move from one status to the other.
func Allowed(from, to string) bool {
	for _, t := range transitions[from] {
		if t == to {
			return true
		}
	}
	return false
}
