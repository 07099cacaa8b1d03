package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zndraw/joblib/internal/dbtest"
)

// cli runs the built binary as an operator would and returns stdout; a
// non-zero exit fails the test unless wantFail.
func cli(t *testing.T, url string, wantFail bool, args ...string) (string, string) {
	t.Helper()
	cmd := exec.Command(joblibBinary(t), args...)
	cmd.Env = append(os.Environ(), "JOBLIB_DATABASE_URL="+url, "JOBLIB_LOG_LEVEL=warn", "USER=ops")
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if (err != nil) != wantFail {
		t.Fatalf("joblib %s: err %v (want failure %v)\nstdout %s\nstderr %s", strings.Join(args, " "), err, wantFail, out.String(), errb.String())
	}
	return out.String(), errb.String()
}

type tokenItem struct {
	ID        string     `json:"id"`
	User      string     `json:"user"`
	Name      string     `json:"name"`
	CreatedAt time.Time  `json:"created_at"`
	LastUsed  *time.Time `json:"last_used_at"`
	ExpiresAt *time.Time `json:"expires_at"`
	RevokedAt *time.Time `json:"revoked_at"`
}

func listTokens(t *testing.T, url string, args ...string) []tokenItem {
	t.Helper()
	out, _ := cli(t, url, false, append([]string{"token", "list", "--json"}, args...)...)
	var v struct {
		Items []tokenItem `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("token list: %v\n%s", err, out)
	}
	return v.Items
}

// The token lifecycle through the binary: create with a TTL, list (never the
// secret), revoke by id and by user, the server refusing revoked tokens, and
// every step in the audit log.
func TestTokenCommands(t *testing.T) {
	t.Parallel()
	for _, d := range dbtest.Dialects {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			url := dbtest.URL(t, d)
			cli(t, url, false, "migrate") // operator commands never create a database
			out, _ := cli(t, url, false, "token", "create", "--user", "dave", "--ttl", "720h")
			tok := strings.TrimSpace(out)
			if !strings.HasPrefix(tok, "jl_") {
				t.Fatalf("token create printed %q", out)
			}
			srv := startServe(t, "JOBLIB_DATABASE_URL="+url, "JOBLIB_CREDENTIAL_CACHE_TTL=0s", "JOBLIB_ADMIN_TOKEN="+testAdminToken)
			if st, _, _ := call(t, "POST", srv.base()+"/workers", tok, nil); st != 201 {
				t.Fatalf("new token: %d", st)
			}
			items := listTokens(t, url, "--user", "dave")
			if len(items) != 1 || items[0].User != "dave" || items[0].ExpiresAt == nil || items[0].LastUsed == nil || items[0].RevokedAt != nil {
				t.Fatalf("token list %+v", items)
			}
			if d := items[0].ExpiresAt.Sub(items[0].CreatedAt); d < 719*time.Hour || d > 721*time.Hour {
				t.Fatalf("expires %s after creation", d)
			}
			if all := listTokens(t, url); len(all) != 2 { // dave's and the admin token
				t.Fatalf("all tokens %+v", all)
			}
			table, _ := cli(t, url, false, "token", "list")
			if strings.Contains(table, tok) || !strings.Contains(table, "dave") || !strings.Contains(table, items[0].ID) {
				t.Fatalf("token list table:\n%s", table)
			}
			out, _ = cli(t, url, false, "token", "revoke", items[0].ID)
			if !strings.Contains(out, "revoked token "+items[0].ID) {
				t.Fatalf("revoke: %s", out)
			}
			st, _, body := call(t, "POST", srv.base()+"/workers", tok, nil)
			if st != 401 || body["detail"] != "Token revoked" {
				t.Fatalf("revoked token: %d %v", st, body)
			}
			if _, errOut := cli(t, url, true, "token", "revoke", items[0].ID); !strings.Contains(errOut, "already revoked") {
				t.Fatalf("second revoke: %s", errOut)
			}
			cli(t, url, false, "token", "create", "--user", "dave")
			cli(t, url, false, "token", "create", "--user", "dave")
			out, _ = cli(t, url, false, "token", "revoke", "--user", "dave")
			if !strings.Contains(out, "revoked 2 token(s) of user dave") {
				t.Fatalf("revoke --user: %s", out)
			}
			for _, it := range listTokens(t, url, "--user", "dave") {
				if it.RevokedAt == nil {
					t.Fatalf("live token after revoke --user: %+v", it)
				}
			}
			cli(t, url, true, "token", "revoke")
			cli(t, url, true, "token", "list", "--user", "nobody")

			aout, _ := cli(t, url, false, "audit", "list", "--json")
			var al struct {
				Items []struct {
					Action string          `json:"action"`
					Actor  string          `json:"actor"`
					Detail json.RawMessage `json:"detail"`
				} `json:"items"`
			}
			if err := json.Unmarshal([]byte(aout), &al); err != nil {
				t.Fatal(err)
			}
			count := map[string]int{}
			for _, e := range al.Items {
				count[e.Action]++
				if e.Actor != "cli:ops" {
					t.Fatalf("actor %q", e.Actor)
				}
			}
			if count["token_create"] != 3 || count["token_revoke"] != 3 || len(al.Items) != 6 {
				t.Fatalf("audit %s", aout)
			}
			if table, _ := cli(t, url, false, "audit", "list", "--action", "token_revoke"); strings.Count(table, "token_revoke") != 3 {
				t.Fatalf("audit table:\n%s", table)
			}
		})
	}
}

// Admin tokens of the tests: long and random enough for serve's check.
const (
	testAdminToken = "jl_test_5e1cc4797f9d70493f38e7675e2adb67fffca6dd"
	oldAdmin       = "jl_old_6bdcc41bfee199be6f31414dd87da6bb342e4a8f"
	newAdmin       = "jl_new_a96f708ee7e6e214180f91645b2909138f6ec417"
)

// A short or guessable JOBLIB_ADMIN_TOKEN stops start-up with a message
// naming the variable, before anything is created in the database.
func TestServeRefusesWeakAdminToken(t *testing.T) {
	t.Parallel()
	for _, d := range dbtest.Dialects {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			url := dbtest.URL(t, d)
			for token, why := range map[string]string{
				"admintok":                                "is 8 characters long; it must have at least 32",
				strings.Repeat("admintok", 5):             "bits of entropy",
				"0123456789abcdef0123456789abcdef":        "bits of entropy",
				"jl_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa": "bits of entropy",
			} {
				// A server that accepts the token keeps running: stopped
				// after a while, it has failed the test.
				ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
				cmd := exec.CommandContext(ctx, joblibBinary(t), "serve")
				cmd.Env = append(os.Environ(), "JOBLIB_DATABASE_URL="+url, "JOBLIB_LISTEN_ADDR=127.0.0.1:0", "JOBLIB_ADMIN_TOKEN="+token)
				out, err := cmd.CombinedOutput()
				cancel()
				if err == nil || !strings.Contains(string(out), "JOBLIB_ADMIN_TOKEN") || !strings.Contains(string(out), why) {
					t.Fatalf("admin token %q: %v\n%s", token, err, out)
				}
			}
			p := startServe(t, "JOBLIB_DATABASE_URL="+url, "JOBLIB_ADMIN_TOKEN="+testAdminToken)
			if st, _, _ := call(t, "GET", p.base()+"/workers", testAdminToken, nil); st != 200 {
				t.Fatalf("a strong admin token: %d", st)
			}
		})
	}
}

// Restarting with a new JOBLIB_ADMIN_TOKEN revokes the old one; a JWT-shaped
// admin token next to a JWT secret stops start-up with the reason.
func TestServeAdminTokenRotation(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t, "sqlite")
	first := startServe(t, "JOBLIB_DATABASE_URL="+url, "JOBLIB_ADMIN_TOKEN="+oldAdmin, "JOBLIB_JWT_SECRET=s3cret")
	if st, _, _ := call(t, "GET", first.base()+"/workers", oldAdmin, nil); st != 200 {
		t.Fatalf("admin token with a JWT secret set: %d", st)
	}
	if err := first.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-first.done
	second := startServe(t, "JOBLIB_DATABASE_URL="+url, "JOBLIB_ADMIN_TOKEN="+newAdmin, "JOBLIB_JWT_SECRET=s3cret")
	if st, _, b := call(t, "GET", second.base()+"/workers", oldAdmin, nil); st != 401 || b["detail"] != "Token revoked" {
		t.Fatalf("old admin token after rotation: %d %v", st, b)
	}
	if st, _, _ := call(t, "GET", second.base()+"/workers", newAdmin, nil); st != 200 {
		t.Fatalf("new admin token: %d", st)
	}
	cmd := exec.Command(joblibBinary(t), "serve")
	cmd.Env = append(os.Environ(), "JOBLIB_DATABASE_URL="+url, "JOBLIB_JWT_SECRET=s3cret", "JOBLIB_LISTEN_ADDR=127.0.0.1:0",
		"JOBLIB_ADMIN_TOKEN=eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "JOBLIB_ADMIN_TOKEN has the shape of a JWT") {
		t.Fatalf("JWT-shaped admin token: %v\n%s", err, out)
	}
}
