// Package client is a Go SDK for joblib workers, built on the server's
// public REST and Socket.IO contract.
//
// Dial connects with an API token; RegisterJob and RegisterProvider register
// a job or a data provider served by the client's worker (creating the
// worker); Run then keeps a Socket.IO connection joined to their rooms —
// which keeps the worker's heartbeat fresh — claims a task on each
// task_available notice and on a polling fallback timer, calls the handler
// and completes or fails the task. While the socket is open a task is
// claimed and started in one claim_tasks event and its outcome reported
// with update_tasks, with no HTTP request at all; otherwise (and for results
// over 64 KiB) it is claimed, started and finished over REST. Provider requests go to the
// provider's handler; the result is uploaded under the request's hash,
// which the SDK computes as the server does. A dropped connection, or a
// restarted server, is re-joined with backoff, so that within the server's
// disconnect grace the worker keeps its id and its claimed tasks; a worker
// the server lost is registered again with its jobs and providers. Close
// deletes the worker.
//
// Claim, Update, Heartbeat and Read are the REST calls underneath, for
// programs that drive the lifecycle themselves. Problem answers are
// *ProblemError values matching sentinels such as ErrNotFound, ErrConflict,
// ErrRateLimited and ErrProviderTimeout with errors.Is.
package client
