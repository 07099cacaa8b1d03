// Package client is a Go SDK for joblib workers, built on the server's
// public REST and Socket.IO contract.
//
// Dial connects with an API token; RegisterJob registers a job served by the
// client's worker (creating the worker); Run then keeps a Socket.IO
// connection joined to the job rooms — which keeps the worker's heartbeat
// fresh — claims a task on each task_available notice and on a polling
// fallback timer (over the socket with claim_tasks while it is open, else
// over REST), marks it running, calls the handler and completes or
// fails it. A dropped connection is re-opened with backoff and re-joined, so
// that within the server's disconnect grace the worker keeps its id and its
// claimed tasks. Close deletes the worker.
//
// Claim, Update and Heartbeat are the REST calls underneath, for workers
// that drive the lifecycle themselves. Problem answers are *ProblemError
// values matching sentinels such as ErrNotFound, ErrConflict and
// ErrRateLimited with errors.Is.
package client
