package joblib

import (
	"syscall"
	"time"
)

// preciseSleepers bounds the threads preciseSleep holds in the kernel at
// once: each sleeping call blocks one thread.
var preciseSleepers = make(chan struct{}, 64)

// preciseSleep sleeps for d at the kernel timer's resolution (tens of
// microseconds). The runtime's timers wake a process whose threads are all
// idle only at the poller's millisecond granularity, which would turn a
// group commit delay of a fifth of a millisecond into a whole one. When
// many calls sleep at once the process is not idle and the runtime's timer
// is precise enough, so past the bound it serves.
func preciseSleep(d time.Duration) {
	select {
	case preciseSleepers <- struct{}{}:
	default:
		time.Sleep(d)
		return
	}
	defer func() { <-preciseSleepers }()
	ts := syscall.NsecToTimespec(int64(d))
	for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
	}
}
