package joblib

import (
	"sync"
	"testing"
	"time"
)

// Every sleep lasts at least its duration, also when more calls sleep at
// once than preciseSleep holds threads for, and the slots all come back.
func TestPreciseSleepLastsAtLeastItsDuration(t *testing.T) {
	const d = 300 * time.Microsecond
	n := 3 * cap(preciseSleepers)
	var wg sync.WaitGroup
	short := make(chan time.Duration, n)
	for range n {
		wg.Go(func() {
			start := time.Now()
			preciseSleep(d)
			if took := time.Since(start); took < d {
				short <- took
			}
		})
	}
	wg.Wait()
	close(short)
	for took := range short {
		t.Errorf("slept %s, asked %s", took, d)
	}
	if len(preciseSleepers) != 0 {
		t.Errorf("%d sleeper slots still held", len(preciseSleepers))
	}
}

// BenchmarkPreciseSleep reports how long a 300 µs sleep takes in an
// otherwise idle process: time.Sleep's wake-up waits for the runtime's
// poller (about a millisecond), preciseSleep's for the kernel timer.
func BenchmarkPreciseSleep(b *testing.B) {
	for _, s := range []struct {
		name  string
		sleep func(time.Duration)
	}{{"precise", preciseSleep}, {"time.Sleep", time.Sleep}} {
		b.Run(s.name, func(b *testing.B) {
			for b.Loop() {
				s.sleep(300 * time.Microsecond)
			}
		})
	}
}
