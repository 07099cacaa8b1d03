package server_test

import (
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
)

type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

func (l *latencies) report(b *testing.B) {
	slices.Sort(l.d)
	if len(l.d) == 0 {
		return
	}
	q := func(p float64) float64 { return float64(l.d[int(p*float64(len(l.d)-1))].Microseconds()) / 1000 }
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
}

func get(b *testing.B, client *http.Client, url, token string, hdr ...string) int {
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := client.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// BenchmarkProviderReadCached is the throughput and latency of cache hits
// over HTTP (auth, provider resolution, cache read, 1 KiB body), with
// GOMAXPROCS×8 concurrent clients.
func BenchmarkProviderReadCached(b *testing.B) {
	for _, d := range dbtest.Dialects {
		b.Run(string(d), func(b *testing.B) {
			e := setup(b, dbtest.Open(b, d))
			id := e.provider(e.admin, "@global", "filesystem", "local")
			params := map[string]string{"path": "/data"}
			e.upload(e.admin, id, joblib.RequestHash(params), make([]byte, 1024)).want(204)
			url := e.url + api + "/rooms/room-1/providers/@global:filesystem:local?path=/data"
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
			var lat latencies
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					start := time.Now()
					if st := get(b, client, url, e.alice); st != 200 {
						b.Errorf("status %d", st)
						return
					}
					lat.add(time.Since(start))
				}
			})
			b.StopTimer()
			lat.report(b)
		})
	}
}

// BenchmarkProviderMissWake is one cache miss end to end: the read
// dispatches provider_request, an in-process worker (a bus subscriber, as the
// Socket.IO layer will be) uploads over HTTP, and the long-polling reader is
// woken. Each iteration uses fresh params, so every read is a miss.
func BenchmarkProviderMissWake(b *testing.B) {
	for _, d := range dbtest.Dialects {
		b.Run(string(d), func(b *testing.B) {
			e := setup(b, dbtest.Open(b, d))
			id := e.provider(e.admin, "@global", "filesystem", "local")
			w := serveProvider(b, e.bus, e.url, e.admin, id, "@global:filesystem:local", func(p map[string]string) []byte {
				return []byte(`{"i":` + p["i"] + `}`)
			})
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			base := e.url + api + "/rooms/room-1/providers/@global:filesystem:local?i="
			var lat latencies
			b.ResetTimer()
			for i := range b.N {
				start := time.Now()
				if st := get(b, client, base+strconv.Itoa(i), e.alice, "Prefer", "wait=10"); st != 200 {
					b.Fatalf("status %d", st)
				}
				lat.add(time.Since(start))
			}
			b.StopTimer()
			if int(w.requests.Load()) != b.N {
				b.Fatalf("%d dispatches for %d misses", w.requests.Load(), b.N)
			}
			lat.report(b)
		})
	}
}
