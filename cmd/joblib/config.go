package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/server"
)

// envPrefix starts every configuration variable.
const envPrefix = "JOBLIB_"

// Config is the whole process configuration, read from the environment.
type Config struct {
	// DatabaseURL: a postgres:// URL selects PostgreSQL; anything else is a
	// SQLite file path.
	DatabaseURL string `env:"DATABASE_URL" envDefault:"joblib.db"`
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
	cfg, err := env.ParseAsWithOptions[Config](env.Options{Prefix: envPrefix, Environment: environ})
	if err != nil {
		return cfg, describeEnvError(err)
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
	return c.Settings.Validate()
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return l, fmt.Errorf("JOBLIB_LOG_LEVEL must be debug, info, warn or error, got %q", s)
	}
	return l, nil
}

// describeEnvError rewrites env's field-named errors to name the variables.
func describeEnvError(err error) error {
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
			msgs = append(msgs, fmt.Sprintf("%s: invalid %s value: %v", name, pe.Type, pe.Err))
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
