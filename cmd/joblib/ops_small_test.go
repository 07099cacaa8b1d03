package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/zndraw/joblib/internal/dbtest"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
)

// On a database with users and no superuser, serve says how to make one
// (nobody could log in to the dashboard otherwise). `joblib health` takes
// the server's base URL, and says plainly when no server listens.
func TestServeWithoutSuperuserAndHealth(t *testing.T) {
	t.Parallel()
	for _, d := range dbtest.Dialects {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			url := dbtest.URL(t, d)
			if _, _, err := runCLIErr(url, "migrate"); err != nil {
				t.Fatal(err)
			}
			if _, _, err := runCLIErr(url, "token", "create", "--user", "alice"); err != nil {
				t.Fatal(err)
			}
			p := startServe(t, "JOBLIB_DATABASE_URL="+url)
			waitLog(t, p, "no superuser exists: nobody can log in to the dashboard (/ui/) or act as an operator; "+
				"make one with `joblib token create --user NAME --superuser`, or set JOBLIB_ADMIN_TOKEN", 10*time.Second)
			for _, args := range [][]string{{"health", "--url", "http://" + p.addr}, {"health", "http://" + p.addr + "/"}} {
				var out, errb bytes.Buffer
				if err := run(context.Background(), args, map[string]string{}, &out, &errb); err != nil || out.String() != "ready: http://"+p.addr+"/readyz\n" {
					t.Fatalf("%v: %q %v", args, out.String(), err)
				}
			}
		})
	}
	// No server: a sentence, not a dial error.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var out, errb bytes.Buffer
	err = run(context.Background(), []string{"health", "--url", "http://" + addr}, map[string]string{}, &out, &errb)
	if err == nil || err.Error() != "no server listens at http://"+addr+" (connection refused): is `joblib serve` running there?" {
		t.Fatalf("health without a server: %v", err)
	}
}

// The superuser check leaves out the CLI's operator users (nobody logs in
// as them) and inactive users.
func TestHasSuperuser(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		ctx := context.Background()
		svc := joblib.New(joblib.Config{DB: db})
		defer svc.Close()
		has := func() bool {
			ok, err := svc.HasSuperuser(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return ok
		}
		if _, _, err := svc.CreateToken(ctx, "alice", false); err != nil {
			t.Fatal(err)
		}
		if _, _, err := svc.IssueOperatorToken(ctx, "ops", time.Minute); err != nil {
			t.Fatal(err)
		}
		if has() {
			t.Fatal("an operator user counted as a superuser one can log in as")
		}
		if _, _, err := svc.CreateToken(ctx, "root", true); err != nil {
			t.Fatal(err)
		}
		if !has() {
			t.Fatal("superuser root not found")
		}
	})
}

// JSON logs write durations as seconds.
func TestJSONLogsDurationsInSeconds(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log, err := newLogger(Config{LogLevel: "info", LogFormat: "json"}, &buf)
	if err != nil {
		t.Fatal(err)
	}
	log.With("component", "x").Info("node started", "recovery_in", 5*time.Second, slog.Group("g", "took", 1500*time.Millisecond))
	var m struct {
		RecoveryIn float64 `json:"recovery_in"`
		G          struct {
			Took float64 `json:"took"`
		} `json:"g"`
	}
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil || m.RecoveryIn != 5 || m.G.Took != 1.5 {
		t.Fatalf("log line %s: %+v %v", buf.String(), m, err)
	}
}

// `audit list --help` names every audited action.
func TestAuditListHelpNamesEveryAction(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"audit", "list", "--help"}, map[string]string{}, &out, &errb); err != nil && err != errHelp {
		t.Fatal(err)
	}
	for _, a := range joblib.AuditActions {
		if !strings.Contains(out.String(), a) {
			t.Errorf("audit list --help does not name %s:\n%s", a, out.String())
		}
	}
	if len(joblib.AuditActions) < 9 {
		t.Errorf("audit actions %v", joblib.AuditActions)
	}
}
