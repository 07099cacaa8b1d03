package joblib

import "github.com/zndraw/joblib/events"

// StatusEvent is the task_status_event Go builds for a task's state (what
// the general path publishes), for the tests that check the SQL-built one
// against it.
func StatusEvent(t Task) events.TaskStatusEvent { return statusEvent(t) }
