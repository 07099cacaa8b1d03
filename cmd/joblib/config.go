package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/models"
	"github.com/zndraw/joblib/server"
)

// envPrefix starts every configuration variable.
const envPrefix = "JOBLIB_"

// Config is the whole process configuration, read from the environment.
type Config struct {
	// DatabaseURL: a postgres:// URL selects PostgreSQL; sqlite://PATH,
	// file:PATH or a plain path a SQLite file; other schemes are refused.
	DatabaseURL string `env:"DATABASE_URL" envDefault:"joblib.db"`
	// BuiltinJobs registers the built-in @internal jobs (RoomSummary).
	// Off by default: rooms then list exactly the jobs clients registered,
	// as with the Python server.
	BuiltinJobs bool `env:"BUILTIN_JOBS" envDefault:"false"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `env:"LOG_LEVEL" envDefault:"info"`
	// LogFormat is text or json.
	LogFormat string `env:"LOG_FORMAT" envDefault:"text"`
	// ShutdownTimeout bounds the drain of in-flight requests on SIGTERM/SIGINT.
	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"30s"`
	// NodeAddr is the host:port other nodes reach this one at (advertised
	// in its lease). Default: the listen address, with this host's name for
	// an unspecified host.
	NodeAddr string `env:"NODE_ADDR"`
	// BusURL selects the event bus between nodes: empty means PostgreSQL
	// NOTIFY (on PostgreSQL; in-process on SQLite), nats://host:port a NATS
	// server (several servers comma-separated).
	BusURL string `env:"BUS_URL"`
	// BusSubject is the NATS subject the nodes of one deployment share.
	BusSubject string `env:"BUS_SUBJECT" envDefault:"joblib.events"`

	Server   server.Config
	Realtime server.RealtimeConfig
	Settings joblib.Settings
}

// loadConfig parses the environment (a map, so tests stay hermetic) and
// validates it. Errors name the offending variable.
func loadConfig(environ map[string]string) (Config, error) {
	environ, _ = resolveAliases(environ)
	cfg, err := env.ParseAsWithOptions[Config](env.Options{Prefix: envPrefix, Environment: environ, FuncMap: envParsers})
	if err != nil {
		return cfg, describeEnvError(err, environ)
	}
	if err := cfg.validate(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

func (c Config) validate() error {
	if _, err := parseLevel(c.LogLevel); err != nil {
		return err
	}
	if err := validateListenAddr(c.Server.ListenAddr); err != nil {
		return fmt.Errorf("JOBLIB_LISTEN_ADDR: %w", err)
	}
	if c.DatabaseURL != "" {
		if _, _, err := models.ParseURL(c.DatabaseURL); err != nil {
			return fmt.Errorf("JOBLIB_DATABASE_URL: %w", err)
		}
	}
	// The settings first: the relations checked below assume them valid
	// (a zero worker timeout is its own error, not the keep-alive's).
	if err := c.Settings.Validate(); err != nil {
		return err
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		return fmt.Errorf("JOBLIB_LOG_FORMAT must be text or json, got %q", c.LogFormat)
	}
	if c.ShutdownTimeout <= 0 {
		return fmt.Errorf("JOBLIB_SHUTDOWN_TIMEOUT must be positive, got %s", c.ShutdownTimeout)
	}
	if c.Server.MaxBodyBytes <= 0 {
		return fmt.Errorf("JOBLIB_MAX_BODY_BYTES must be positive, got %d", c.Server.MaxBodyBytes)
	}
	if c.BusURL != "" {
		for _, u := range strings.Split(c.BusURL, ",") {
			if u = strings.TrimSpace(u); !strings.HasPrefix(u, "nats://") && !strings.HasPrefix(u, "tls://") {
				return fmt.Errorf("JOBLIB_BUS_URL must be nats://host:port (or tls://), got %q", u)
			}
		}
		if c.BusSubject == "" || strings.ContainsAny(c.BusSubject, " \t*>") {
			return fmt.Errorf("JOBLIB_BUS_SUBJECT must be a plain NATS subject, got %q", c.BusSubject)
		}
	}
	if c.Server.MaxJSONDepth < 1 || c.Server.MaxListOffset < 1 {
		return fmt.Errorf("JOBLIB_MAX_JSON_DEPTH must be positive and JOBLIB_MAX_LIST_OFFSET positive, got %d and %d", c.Server.MaxJSONDepth, c.Server.MaxListOffset)
	}
	if c.Server.ReadDBTimeout < 0 || c.Server.WriteDBTimeout < 0 {
		return errors.New("JOBLIB_READ_DB_TIMEOUT and JOBLIB_WRITE_DB_TIMEOUT must not be negative")
	}
	if c.DatabaseURL == "" {
		return errors.New("JOBLIB_DATABASE_URL must not be empty")
	}
	if c.Realtime.PingInterval <= 0 || c.Realtime.PingTimeout <= 0 || c.Realtime.DisconnectGrace < 0 || c.Realtime.KeepAliveInterval < 0 {
		return errors.New("JOBLIB_PING_INTERVAL and JOBLIB_PING_TIMEOUT must be positive, JOBLIB_DISCONNECT_GRACE and JOBLIB_SOCKET_KEEPALIVE_INTERVAL not negative")
	}
	if c.Realtime.KeepAliveInterval >= c.Settings.WorkerTimeout {
		return fmt.Errorf("JOBLIB_SOCKET_KEEPALIVE_INTERVAL (%s) must be shorter than JOBLIB_WORKER_TIMEOUT (%s)", c.Realtime.KeepAliveInterval, c.Settings.WorkerTimeout)
	}
	if c.Realtime.MaxMessageBytes <= 0 || c.Realtime.SendQueue <= 0 {
		return errors.New("JOBLIB_SOCKET_MAX_MESSAGE_BYTES and JOBLIB_SOCKET_SEND_QUEUE must be positive")
	}
	if r := c.Realtime; r.ConnectTimeout <= 0 || r.MaxAttachments <= 0 || r.MaxEventBytes <= 0 || r.MaxEventDepth <= 0 ||
		r.MaxRooms <= 0 || r.MaxSessions <= 0 || r.MaxSessionsPerAddr <= 0 || r.MaxHints <= 0 {
		return errors.New("JOBLIB_SOCKET_CONNECT_TIMEOUT, _MAX_ATTACHMENTS, _MAX_EVENT_BYTES, _MAX_JSON_DEPTH, _MAX_ROOMS, _MAX_SESSIONS, _MAX_SESSIONS_PER_ADDR and _MAX_HINTS must be positive")
	}
	if r := c.Realtime; r.RecoveryWindow < 0 || r.RecoveryMaxPackets <= 0 || r.RecoveryMaxBytes <= 0 || r.RecoveryHistoryBytes <= 0 {
		return errors.New("JOBLIB_SOCKET_RECOVERY_WINDOW must not be negative, JOBLIB_SOCKET_RECOVERY_MAX_PACKETS, _MAX_BYTES and _HISTORY_BYTES must be positive")
	}
	return c.Server.Validate()
}

// validateListenAddr accepts host:port with a numeric port (host may be
// empty: every interface).
func validateListenAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("listen address %q must be host:port (e.g. :8080 or 127.0.0.1:8080)", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("listen address %q: port must be a number from 0 to 65535", addr)
	}
	return nil
}

// otherVariables are JOBLIB_ variables read outside Config: the test
// suite's database, and the client variables of the examples, which a shell
// exports for them (the server ignores them without a warning).
var otherVariables = []string{"JOBLIB_TEST_DATABASE_URL", "JOBLIB_CLIENT_URL", "JOBLIB_CLIENT_TOKEN", "JOBLIB_URL", "JOBLIB_TOKEN"}

// knownVariables lists every JOBLIB_ variable joblib reads.
func knownVariables() []string {
	// Every field's variable, also where two structs name a field alike
	// (the REST and the socket JSON depth budgets are both MaxJSONDepth).
	out := append([]string(nil), otherVariables...)
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			if tag := f.Tag.Get("env"); tag != "" {
				out = append(out, envPrefix+strings.Split(tag, ",")[0])
			} else if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Time{}) {
				walk(f.Type)
			}
		}
	}
	walk(reflect.TypeOf(Config{}))
	slices.Sort(out)
	return slices.Compact(out)
}

// unknownVariables warns about JOBLIB_ variables joblib does not read (a
// typo silently ignored is worse than a warning), naming the closest
// known one.
func unknownVariables(environ map[string]string) []string {
	known := knownVariables()
	var warnings []string
	for k := range environ {
		if !strings.HasPrefix(k, envPrefix) || slices.Contains(known, k) {
			continue
		}
		best, bestD := "", -1
		for _, n := range known {
			if d := editDistance(k, n); bestD < 0 || d < bestD {
				best, bestD = n, d
			}
		}
		w := fmt.Sprintf("unknown variable %s is ignored", k)
		if bestD >= 0 && bestD <= max(3, len(k)/3) {
			w += fmt.Sprintf("; did you mean %s?", best)
		}
		warnings = append(warnings, w)
	}
	slices.Sort(warnings)
	return warnings
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return l, fmt.Errorf("JOBLIB_LOG_LEVEL must be debug, info, warn or error, got %q", s)
	}
	return l, nil
}

// describeEnvError rewrites env's field-named errors to name the variables
// and their values (never a Go type: the parsers' errors say the form).
func describeEnvError(err error, environ map[string]string) error {
	vars := map[string]string{}
	collectEnvNames(reflect.TypeOf(Config{}), vars)
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return fmt.Errorf("read configuration: %w", err)
	}
	var msgs []string
	for _, e := range agg.Errors {
		var pe env.ParseError
		if errors.As(e, &pe) {
			name := vars[pe.Name]
			if name == "" {
				name = pe.Name
			}
			msgs = append(msgs, fmt.Sprintf("%s=%q: %v", name, environ[name], pe.Err))
			continue
		}
		msgs = append(msgs, e.Error())
	}
	return fmt.Errorf("invalid configuration: %s", strings.Join(msgs, "; "))
}

func collectEnvNames(t reflect.Type, out map[string]string) {
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Type.Kind() == reflect.Struct && f.Tag.Get("env") == "" && f.Type != reflect.TypeOf(time.Time{}) {
			collectEnvNames(f.Type, out)
			continue
		}
		if tag := f.Tag.Get("env"); tag != "" {
			out[f.Name] = envPrefix + strings.Split(tag, ",")[0]
		}
	}
}

func environMap() map[string]string {
	m := map[string]string{}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}
