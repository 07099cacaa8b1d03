package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/server"
)

// Mutating operator commands (sweep --fix, tasks retry, tasks cancel,
// workers delete) must take effect in the running servers exactly as the
// dashboard's actions do: the server publishes the events (on SQLite no
// other process can reach its sockets), counts the metrics and closes the
// sockets of removed workers. So when the database has a live node (its
// lease, judged by the database clock), the command is sent to that node's
// admin API; only when no server runs does it act on the database itself.
// The command authenticates with a superuser token it issues itself for
// "cli:<operator>" (whoever can write the database can do as much), valid
// for operatorTokenTTL and revoked when the command ends.

// operatorTokenTTL bounds the life of the token a command issues itself.
const operatorTokenTTL = 2 * time.Minute

// serverFlag declares --server on a mutating command.
func serverFlag(fs *flag.FlagSet) *string {
	return fs.String("server", "", "send the action to the server at `URL` (default: a live node of the database, from its lease)")
}

// errNoServer: no server runs on the database; act on it directly.
var errNoServer = errors.New("no live server")

// viaServer sends an operator action to a running server and decodes its
// answer into out. It returns errNoServer when none runs (and serverURL is
// empty): the caller then acts on the database.
func (o opsEnv) viaServer(ctx context.Context, svc *joblib.Service, serverURL, operator, method, path string, body, out any) error {
	var targets []string
	if serverURL != "" {
		targets = []string{strings.TrimRight(serverURL, "/")}
	} else {
		nodes, err := svc.DB().Q(ctx).ListNodes()
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if n.Live && n.Addr != "" {
				targets = append(targets, "http://"+n.Addr)
			}
		}
		if len(targets) == 0 {
			return errNoServer
		}
	}
	token, tid, err := svc.IssueOperatorToken(ctx, operator, operatorTokenTTL)
	if err != nil {
		return err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := svc.RevokeOperatorToken(rctx, tid); err != nil {
			o.log.Warn("revoke the command's token (it expires by itself)", "token_id", tid, "expires_in", operatorTokenTTL, "err", err)
		}
	}()
	var payload []byte
	if body != nil {
		if payload, err = json.Marshal(body); err != nil {
			return err
		}
	}
	var dialErrs []string
	for _, base := range targets {
		err := callServer(ctx, base+"/v1/joblib"+path, method, token, payload, out)
		var ue *unreachableError
		if errors.As(err, &ue) {
			dialErrs = append(dialErrs, ue.Error())
			continue
		}
		if err == nil {
			o.log.Info("operator action sent to a running server", "server", base, "path", path)
		}
		return err
	}
	return fmt.Errorf("a server runs on this database but none answered (%s): the action must go through it so that its sockets, "+
		"events and metrics follow; run the command where a node is reachable, or pass --server URL", strings.Join(dialErrs, "; "))
}

// unreachableError: the server did not answer at all.
type unreachableError struct{ err error }

func (u *unreachableError) Error() string { return u.err.Error() }

// callServer makes one admin API request. A problem answer becomes an error
// with its detail and type.
func callServer(ctx context.Context, url, method, token string, payload []byte, out any) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var rd io.Reader
	if payload != nil {
		rd = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return &unreachableError{err}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return err
	}
	if res.StatusCode >= 300 {
		var p server.Problem
		if json.Unmarshal(b, &p) == nil && p.Detail != "" {
			return fmt.Errorf("%s (%d %s)", p.Detail, res.StatusCode, strings.TrimPrefix(p.Type, "/v1/problems/"))
		}
		return fmt.Errorf("%s %s: %s", method, url, res.Status)
	}
	return json.Unmarshal(b, out)
}

// operatorName is who runs a command: --actor, else $USER, else "operator".
func (o opsEnv) operatorName(actor string) string {
	return cmp.Or(actor, o.env.environ["USER"], "operator")
}

// writeJSON prints v as JSON as it is: never HTML-escaped (a CLI is no web
// page, and `>` in an error should read as `>`).
func writeJSON(w io.Writer, v any, indent bool) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	if indent {
		enc.SetIndent("", "  ")
	}
	return enc.Encode(v)
}

// operatorActionSpec describes an operator action on one object (a task, a
// worker): the dashboard's endpoint a running server takes it on, and what
// the command does on the database when no server runs.
type operatorActionSpec[T any] struct {
	name, path, what, summary string
	method                    string
	endpoint                  func(id uuid.UUID) string
	local                     func(ctx context.Context, svc *joblib.Service, id uuid.UUID, actor string) (T, error)
	print                     func(w io.Writer, v T)
}

// operatorAction is the command of an operator action: `<path> ID`, with
// --actor, --json and --server.
func operatorAction[T any](a operatorActionSpec[T]) *command {
	c := opsCommand(a.name, a.summary, func(fs *flag.FlagSet) func(context.Context, opsEnv) error {
		actor := fs.String("actor", "", "who acts, for the audit log (default $USER)")
		asJSON := fs.Bool("json", false, "print the answer as JSON")
		srv := serverFlag(fs)
		return func(ctx context.Context, o opsEnv) error {
			id, err := uuid.Parse(o.args[0])
			if err != nil {
				return o.env.usageErr(a.path, "%q is not a %s id", o.args[0], a.what)
			}
			who := o.operatorName(*actor)
			svc, closeFn, err := o.service(ctx)
			if err != nil {
				return err
			}
			defer closeFn()
			var out T
			err = o.viaServer(ctx, svc, *srv, who, a.method, a.endpoint(id), nil, &out)
			if errors.Is(err, errNoServer) {
				out, err = a.local(ctx, svc, id, joblib.OperatorUserPrefix+who)
			}
			if err != nil {
				return fmt.Errorf("%s %s: %w", strings.TrimPrefix(a.path, "joblib "), id, err)
			}
			if *asJSON {
				return writeJSON(o.stdout(), out, false)
			}
			a.print(o.stdout(), out)
			return nil
		}
	})
	c.args, c.nargs = "ID", 1
	return c
}

func cancelCommand() *command {
	return operatorAction(operatorActionSpec[joblib.Task]{
		name: "cancel", path: "joblib tasks cancel", what: "task", summary: "cancel a task, as the dashboard does (audited)",
		method: http.MethodPost, endpoint: func(id uuid.UUID) string { return "/dashboard/tasks/" + id.String() + "/cancel" },
		local: func(ctx context.Context, svc *joblib.Service, id uuid.UUID, actor string) (joblib.Task, error) {
			return svc.CancelTask(ctx, id, actor)
		},
		print: func(w io.Writer, t joblib.Task) {
			fmt.Fprintf(w, "task %s is %s (job %s, room %s)\n", t.ID, t.Status, t.JobName, t.RoomID)
		},
	})
}

func deleteWorkerCommand() *command {
	return operatorAction(operatorActionSpec[server.DeleteWorkerResult]{
		name: "delete", path: "joblib workers delete", what: "worker",
		summary: "delete a worker as the dashboard does: its tasks fail or requeue, its socket closes (audited)",
		method:  http.MethodDelete, endpoint: func(id uuid.UUID) string { return "/dashboard/workers/" + id.String() },
		local: func(ctx context.Context, svc *joblib.Service, id uuid.UUID, actor string) (server.DeleteWorkerResult, error) {
			res, err := svc.OperatorDeleteWorker(ctx, id, actor)
			return server.DeleteWorkerResult{WorkerID: id, TasksFailed: res.TasksFailed, TasksRequeued: res.TasksRequeued, OrphanJobs: res.OrphanJobs}, err
		},
		print: func(w io.Writer, r server.DeleteWorkerResult) {
			fmt.Fprintf(w, "deleted worker %s: %d task(s) failed, %d requeued, %d job(s) orphaned\n", r.WorkerID, r.TasksFailed, r.TasksRequeued, r.OrphanJobs)
		},
	})
}

func jobsCommand() *command {
	return &command{
		name:    "jobs",
		summary: "inspect jobs",
		subs: []*command{
			opsCommand("list", "list live jobs with their queue: workers, pending and active tasks", func(fs *flag.FlagSet) func(context.Context, opsEnv) error {
				room := fs.String("room", "", "only the jobs of this room")
				asJSON := fs.Bool("json", false, "print JSON")
				return func(ctx context.Context, o opsEnv) error {
					d, err := o.dashboard(ctx)
					if err != nil {
						return err
					}
					jobs := []joblib.DashJob{}
					for _, j := range d.Jobs {
						if *room == "" || j.RoomID == *room {
							jobs = append(jobs, j)
						}
					}
					if *asJSON {
						return writeJSON(o.stdout(), map[string]any{"total": d.Totals.Jobs, "items": jobs}, false)
					}
					fmt.Fprintf(o.stdout(), "%d job(s) (showing %d)\n", d.Totals.Jobs, len(jobs))
					tw := tabwriter.NewWriter(o.stdout(), 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "JOB\tROOM\tWORKERS\tPENDING\tACTIVE\tON WORKER LOSS")
					for _, j := range jobs {
						fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\n", j.FullName, j.RoomID, j.Workers, j.Pending, j.Active, j.OnWorkerLoss)
					}
					return tw.Flush()
				}
			}),
		},
	}
}

func roomsCommand() *command {
	return &command{
		name:    "rooms",
		summary: "inspect rooms",
		subs: []*command{
			opsCommand("list", "list rooms with their jobs, providers, workers and tasks by status", func(fs *flag.FlagSet) func(context.Context, opsEnv) error {
				asJSON := fs.Bool("json", false, "print JSON")
				return func(ctx context.Context, o opsEnv) error {
					d, err := o.dashboard(ctx)
					if err != nil {
						return err
					}
					rooms := d.Rooms
					if rooms == nil {
						rooms = []joblib.DashRoom{}
					}
					if *asJSON {
						return writeJSON(o.stdout(), map[string]any{"items": rooms}, false)
					}
					fmt.Fprintf(o.stdout(), "%d room(s)\n", len(rooms))
					tw := tabwriter.NewWriter(o.stdout(), 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "ROOM\tJOBS\tPROVIDERS\tWORKERS\tPENDING\tRUNNING\tCOMPLETED\tFAILED")
					for _, r := range rooms {
						fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", r.RoomID, r.Jobs, r.Providers, r.Workers, r.Tasks["pending"],
							r.Tasks["claimed"]+r.Tasks["running"], r.Tasks["completed"], r.Tasks["failed"])
					}
					return tw.Flush()
				}
			}),
		},
	}
}

// dashboard reads the fleet as the dashboard shows it.
func (o opsEnv) dashboard(ctx context.Context) (joblib.Dashboard, error) {
	svc, closeFn, err := o.service(ctx)
	if err != nil {
		return joblib.Dashboard{}, err
	}
	defer closeFn()
	return svc.Dashboard(ctx)
}
