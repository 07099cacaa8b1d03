// Package joblib is the coordinator's domain: the registry of workers, jobs and
// providers, the task lifecycle (submit, claim, transition), CleanupWorker and the
// services that call it. Every mutation runs in one transaction and returns the
// events it caused; events are published only after the transaction commits.
package joblib
