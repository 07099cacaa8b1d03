package server_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// bystanderReads runs GET listings as another user until stop is closed and
// reports how many failed.
func bystanderReads(e *env, stop <-chan struct{}) func() (ok, failed int) {
	var wg sync.WaitGroup
	var okN, failN int
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if r := e.do(e.alice, "GET", api+"/rooms/calm/jobs", nil); r.Status == 200 {
				okN++
			} else {
				failN++
			}
		}
	})
	return func() (int, int) { wg.Wait(); return okN, failN }
}

// The attack of 25 large provider result uploads: the in-memory cache keeps
// at most its byte budget, so the heap grows by about that much, not by
// the 50 MB uploaded; every upload is accepted (older results are evicted)
// and a bystander's reads keep succeeding meanwhile.
func TestAbuseProviderUploadsMemoryBounded(t *testing.T) {
	// Not parallel: it measures this process's heap.
	db := dbtest.Open(t, models.SQLite)
	e := setup(t, db, withSettings(func(s *joblib.Settings) {
		s.ProviderCacheBytes, s.ProviderCacheShare = 8<<20, 1
	}))
	pid := e.provider(e.bob, "room", "filesystem", "big")
	body := bytes.Repeat([]byte("z"), 2<<20)
	before := heapAfterGC()
	stop := make(chan struct{})
	wait := bystanderReads(e, stop)
	for i := range 25 {
		h := sha256.Sum256([]byte(strconv.Itoa(i)))
		e.upload(e.bob, pid, hex.EncodeToString(h[:]), body).want(204)
	}
	close(stop)
	ok, failed := wait()
	growth := int64(heapAfterGC()) - int64(before)
	if growth > 20<<20 {
		t.Fatalf("heap grew by %d MB for an 8 MB cache budget", growth>>20)
	}
	if by, n, _ := e.svc.ResultCache().Usage(t.Context()); by > 8<<20 || n != 4 {
		t.Fatalf("cache holds %d bytes in %d results", by, n)
	}
	if failed != 0 || ok == 0 {
		t.Fatalf("bystander: %d ok, %d failed", ok, failed)
	}
}

// The attack of deeply nested payloads: 50 bodies nested 100,000 levels
// deep are refused in one linear pass each, without the heap growing by
// their size per level, and a bystander's reads keep succeeding.
func TestAbuseDeepPayloadsCheap(t *testing.T) {
	db := dbtest.Open(t, models.SQLite)
	e := setup(t, db)
	e.seed()
	const depth = 100000
	body := `{"payload":` + strings.Repeat(`[`, depth) + strings.Repeat(`]`, depth) + `}`
	stop := make(chan struct{})
	wait := bystanderReads(e, stop)
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	for range 50 {
		e.do(e.bob, "POST", api+"/rooms/room/tasks/"+rotate, body).problem(422, "validation-error")
	}
	runtime.ReadMemStats(&m1)
	close(stop)
	ok, failed := wait()
	// Reading a 200 kB body costs a few hundred kB of allocation; decoding
	// it into nested values would cost tens of MB per request.
	if per := (m1.TotalAlloc - m0.TotalAlloc) / 50; per > 8<<20 {
		t.Fatalf("%d bytes allocated per refused request", per)
	}
	if n := e.total(api + "/rooms/room/tasks"); n != 0 {
		t.Fatalf("%d deep payloads stored", n)
	}
	if failed != 0 || ok == 0 {
		t.Fatalf("bystander: %d ok, %d failed", ok, failed)
	}
}
