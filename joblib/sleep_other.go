//go:build !linux

package joblib

import "time"

// preciseSleep sleeps for d (see sleep_linux.go).
func preciseSleep(d time.Duration) { time.Sleep(d) }
