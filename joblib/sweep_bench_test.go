package joblib_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// BenchmarkSweep measures one sweep on PostgreSQL over 10,000 workers
// holding 50,000 claimed and running tasks: all stale (the sweep cleans
// them), or none stale (the idle cost of a sweep). It reports the
// statements sent to the database per sweep (BEGIN/COMMIT included) and,
// when PostgreSQL runs on this machine (its backends' /proc entries are
// readable), the CPU its backends spent on the sweep: wall time on a loaded
// machine varies with the load, CPU time much less.
//
//	go test -run '^$' -bench BenchmarkSweep -benchtime 3x ./joblib
func BenchmarkSweep(b *testing.B) {
	const workers, tasksEach = 10_000, 5
	for _, bc := range []struct {
		name  string
		stale bool
		batch int
		cap   bool // as the background sweeper runs it: blast-radius cap on
	}{
		{"stale/batch=500", true, 500, false},
		{"stale/batch=1000", true, 1000, false},
		{"idle", false, 500, false},
		{"idle/cap", false, 500, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			var stmts atomic.Int64
			app := "joblib-bench-sweep-" + uuid.NewString()[:8]
			db, err := models.Open(ctx, dbtest.URL(b, models.Postgres)+"&application_name="+app, models.OpenOptions{Statements: &stmts})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { db.Close() })
			if _, err := db.Migrate(ctx); err != nil {
				b.Fatal(err)
			}
			st := joblib.DefaultSettings()
			st.SweepBatchSize = bc.batch
			if bc.cap {
				st.SweepMaxFraction = 0.5
			}
			svc := joblib.New(joblib.Config{DB: db, Settings: st})
			b.Cleanup(svc.Close)
			_, owner, err := svc.CreateToken(ctx, "owner", false)
			if err != nil {
				b.Fatal(err)
			}
			q := db.Q(ctx)
			job := models.Job{ID: uuid.New(), RoomID: "bench", Category: "modifiers", Name: "j", Schema: "{}", OnWorkerLoss: "fail", MaxAttempts: 1}
			if _, err := q.InsertJobIfAbsent(job); err != nil {
				b.Fatal(err)
			}
			seed := func(age time.Duration) {
				if _, err := q.SeedWorkers(owner.ID, job.ID, workers, tasksEach, age); err != nil {
					b.Fatal(err)
				}
				if _, err := db.Pool.Exec(ctx, "ANALYZE"); err != nil {
					b.Fatal(err)
				}
			}
			if !bc.stale {
				seed(0)
			}
			var total int64
			var cpu, self time.Duration
			cpuKnown := true
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				if bc.stale {
					seed(2 * time.Minute)
				}
				cpu0, ok0 := backendCPU(ctx, db, app)
				before := stmts.Load()
				self0 := selfCPU()
				b.StartTimer()
				rep, err := svc.Sweep(ctx, joblib.SweepParams{Threshold: time.Minute, Cap: bc.cap})
				total += stmts.Load() - before
				self += selfCPU() - self0
				b.StopTimer()
				cpu1, ok1 := backendCPU(ctx, db, app)
				b.StartTimer()
				cpuKnown = cpuKnown && ok0 && ok1
				for pid, t := range cpu1 {
					cpu += t - cpu0[pid]
				}
				if err != nil {
					b.Fatal(err)
				}
				want := 0
				if bc.stale {
					want = workers
				}
				if rep.Result.Cleaned != want || rep.Result.TasksFailed != want*tasksEach {
					b.Fatalf("cleaned %d workers and %d tasks, want %d and %d", rep.Result.Cleaned, rep.Result.TasksFailed, want, want*tasksEach)
				}
			}
			b.ReportMetric(float64(total)/float64(b.N), "statements/op")
			b.ReportMetric(float64(self.Milliseconds())/float64(b.N), "go-cpu-ms/op")
			if cpuKnown {
				b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "pg-cpu-ms/op")
			}
		})
	}
}

// backendCPU reads the CPU time (user + system) of the PostgreSQL backends
// serving the connections named app, by pid, from /proc; ok is false when
// they cannot be read (PostgreSQL on another machine).
func backendCPU(ctx context.Context, db *models.DB, app string) (map[int]time.Duration, bool) {
	rows, err := db.Pool.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", app)
	if err != nil {
		return nil, false
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil || len(pids) == 0 {
		return nil, false
	}
	out := make(map[int]time.Duration, len(pids))
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil, false
		}
		// Fields after the command (which may hold spaces) start after ')'.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 13 {
			return nil, false
		}
		ut, err1 := strconv.ParseInt(f[11], 10, 64)
		st, err2 := strconv.ParseInt(f[12], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, false
		}
		out[pid] = time.Duration(ut+st) * 10 * time.Millisecond // USER_HZ = 100
	}
	return out, true
}

// selfCPU is the CPU time this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
