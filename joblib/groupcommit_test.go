package joblib

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"
)

// delayed is a groupCommit over int calls whose statement takes stmt (in a
// synctest bubble: exactly) and answers each call with itself times ten.
type delayed struct {
	*groupCommit[string, int, int]
	mu      sync.Mutex
	batches [][]int
}

const stmt = 300 * time.Microsecond

func newDelayed(max int, delay time.Duration) *delayed {
	d := &delayed{}
	id := func(n int) uuid.UUID { return uuid.UUID{byte(n)} }
	d.groupCommit = newGroupCommit(max, id, func() time.Duration { return delay }, func(_ context.Context, _ string, reqs []int) ([]int, error) {
		d.mu.Lock()
		d.batches = append(d.batches, slices.Clone(reqs))
		d.mu.Unlock()
		time.Sleep(stmt)
		out := make([]int, len(reqs))
		for i, r := range reqs {
			out[i] = r * 10
		}
		return out, nil
	})
	d.sleep = time.Sleep // the bubble's clock
	return d
}

// took is how long call n of key took (bubble time), checking its answer.
func (d *delayed) took(t *testing.T, key string, n int) time.Duration {
	t.Helper()
	start := time.Now()
	a, err := d.call(context.Background(), key, n)
	if err != nil || a != n*10 {
		t.Errorf("call %d: %d, %v", n, a, err)
	}
	return time.Since(start)
}

// goCall runs call n of key in a goroutine and returns how long it took once
// done.
func (d *delayed) goCall(t *testing.T, key string, n int) <-chan time.Duration {
	out := make(chan time.Duration, 1)
	go func() { out <- d.took(t, key, n) }()
	return out
}

// last is the calls of the last batch, in order of value (calls that start
// at the same instant queue in any order).
func (d *delayed) last() []int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Sorted(slices.Values(d.batches[len(d.batches)-1]))
}

// makeBusy sends call n of key and, while it is in the statement, calls n+1
// and n+2, which share the next batch: key is then busy.
func (d *delayed) makeBusy(t *testing.T, key string, n int) {
	first := d.goCall(t, key, n)
	synctest.Wait()
	second, third := d.goCall(t, key, n+1), d.goCall(t, key, n+2)
	<-first
	<-second
	<-third
}

// A call that would go to the database alone waits the delay for company
// only while its key is busy (one of its batches of the last sharedWindow
// carried more than one call), and takes along every call that arrived
// meanwhile; calls that queue behind a statement go without it; a key that
// is idle, has gone quiet,
// or has only ever seen one call at a time never waits; nor does another
// key when one is busy.
func TestGroupCommitDelayWaitsOnlyWhileBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const delay = 200 * time.Microsecond
		d := newDelayed(4, delay)

		// An idle key: calls one after the other never wait.
		for n := 1; n <= 3; n++ {
			if got := d.took(t, "fleet", n); got != stmt {
				t.Errorf("lone call %d of an idle key took %v, want the statement's %v", n, got, stmt)
			}
		}

		// Two calls queue behind one in the database: they share a batch,
		// and the key is busy.
		first := d.goCall(t, "fleet", 4)
		synctest.Wait()
		second, third := d.goCall(t, "fleet", 5), d.goCall(t, "fleet", 6)
		<-first
		if got := <-second; got != 2*stmt {
			t.Errorf("queued call took %v, want %v", got, 2*stmt)
		}
		<-third
		if b := d.last(); !slices.Equal(b, []int{5, 6}) {
			t.Fatalf("queued calls went as %v, want one batch [5 6]", b)
		}

		// Now a lone call waits the delay and takes along the call that
		// arrives meanwhile.
		lone := d.goCall(t, "fleet", 7)
		time.Sleep(delay / 2)
		late := d.goCall(t, "fleet", 8)
		if got := <-lone; got != delay+stmt {
			t.Errorf("lone call of a busy key took %v, want the delay and the statement, %v", got, delay+stmt)
		}
		if got := <-late; got != delay/2+stmt {
			t.Errorf("the call that joined it took %v, want %v", got, delay/2+stmt)
		}
		if b := d.last(); !slices.Equal(b, []int{7, 8}) {
			t.Errorf("the waiting call went as %v, want [7 8]", b)
		}

		// Calls that queue behind a statement in flight have company: they
		// go as soon as it is done, without the delay.
		lone = d.goCall(t, "fleet", 11)
		time.Sleep(delay + stmt/2)
		queued := []<-chan time.Duration{d.goCall(t, "fleet", 12), d.goCall(t, "fleet", 13)}
		<-lone
		for _, c := range queued {
			if got := <-c; got != stmt/2+stmt {
				t.Errorf("a call queued behind a statement took %v, want %v", got, stmt/2+stmt)
			}
		}

		// Another key is not busy because this one is.
		if got := d.took(t, "other", 9); got != stmt {
			t.Errorf("lone call of another key took %v, want %v", got, stmt)
		}

		// Quiet for the window: lone calls go at once again.
		time.Sleep(sharedWindow)
		if got := d.took(t, "fleet", 14); got != stmt {
			t.Errorf("lone call after %v of quiet took %v, want %v", sharedWindow, got, stmt)
		}
	})
}

// With no delay, a lone call never waits, however busy its key.
func TestGroupCommitWithoutDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDelayed(4, 0)
		d.makeBusy(t, "fleet", 1)
		if got := d.took(t, "fleet", 4); got != stmt {
			t.Errorf("lone call of a busy key without delay took %v, want %v", got, stmt)
		}
	})
}

// The keys the batcher remembers as busy stay bounded: past maxShared, the
// ones quiet for the window are forgotten.
func TestGroupCommitForgetsQuietKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDelayed(4, time.Microsecond)
		d.groupCommit.mu.Lock()
		for range maxShared {
			d.shared[uuid.NewString()] = time.Now()
		}
		d.groupCommit.mu.Unlock()
		time.Sleep(sharedWindow)
		d.makeBusy(t, "fleet", 1)
		d.groupCommit.mu.Lock()
		n := len(d.shared)
		d.groupCommit.mu.Unlock()
		if n != 1 {
			t.Errorf("%d keys remembered, want the one busy key", n)
		}
	})
}
