package main

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/zndraw/joblib/joblib"
)

// test_settings.py, for our configuration: JOBLIB_-prefixed variables,
// durations in Go syntax, lists as JSON arrays (the Python server's form) or
// comma separated.

// Without any variable every setting has its documented default.
func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	st := cfg.Settings
	if !reflect.DeepEqual(st.AllowedCategories, joblib.List{"modifiers", "selections", "analysis"}) {
		t.Errorf("allowed categories %v", st.AllowedCategories)
	}
	want := map[string][2]time.Duration{
		"worker timeout":        {st.WorkerTimeout, 60 * time.Second},
		"sweeper interval":      {st.SweeperInterval, 30 * time.Second},
		"long-poll max wait":    {st.LongPollMaxWait, 60 * time.Second},
		"internal task timeout": {st.InternalTaskTimeout, time.Hour},
		"provider result TTL":   {st.ProviderResultTTL, 300 * time.Second},
		"provider inflight TTL": {st.ProviderInflightTTL, 30 * time.Second},
		"provider default wait": {st.ProviderLongPollDefault, 5 * time.Second},
		"provider max wait":     {st.ProviderLongPollMax, 30 * time.Second},
	}
	for name, v := range want {
		if v[0] != v[1] {
			t.Errorf("%s %s, want %s", name, v[0], v[1])
		}
	}
	if len(st.AllowedProviderCategories) != 0 {
		t.Errorf("provider categories %v, want unrestricted", st.AllowedProviderCategories)
	}
	if !reflect.DeepEqual(st, joblib.DefaultSettings()) {
		t.Errorf("settings %+v differ from joblib.DefaultSettings() %+v", st, joblib.DefaultSettings())
	}
	if cfg.Server.ListenAddr != ":8080" || cfg.Server.MaxBodyBytes != 8<<20 || cfg.Server.PublicReads {
		t.Errorf("server config %+v", cfg.Server)
	}
	if cfg.DatabaseURL != "joblib.db" || cfg.LogLevel != "info" || cfg.LogFormat != "text" || cfg.ShutdownTimeout != 30*time.Second {
		t.Errorf("process config %+v", cfg)
	}
}

// Variables override the defaults; lists accept the JSON-array form and the
// comma form.
func TestConfigFromEnvironment(t *testing.T) {
	t.Parallel()
	cases := []struct {
		env   map[string]string
		check func(Config) bool
	}{
		{map[string]string{"JOBLIB_ALLOWED_CATEGORIES": `["custom"]`, "JOBLIB_WORKER_TIMEOUT": "120s"}, func(c Config) bool {
			return reflect.DeepEqual(c.Settings.AllowedCategories, joblib.List{"custom"}) && c.Settings.WorkerTimeout == 120*time.Second
		}},
		{map[string]string{"JOBLIB_ALLOWED_CATEGORIES": "custom, other,third"}, func(c Config) bool {
			return reflect.DeepEqual(c.Settings.AllowedCategories, joblib.List{"custom", "other", "third"})
		}},
		{map[string]string{"JOBLIB_ALLOWED_CATEGORIES": ` ["a", "b"] `}, func(c Config) bool {
			return reflect.DeepEqual(c.Settings.AllowedCategories, joblib.List{"a", "b"})
		}},
		{map[string]string{"JOBLIB_ALLOWED_PROVIDER_CATEGORIES": `["frames"]`}, func(c Config) bool {
			return reflect.DeepEqual(c.Settings.AllowedProviderCategories, joblib.List{"frames"})
		}},
		{map[string]string{
			"JOBLIB_SWEEPER_INTERVAL": "5s", "JOBLIB_LONG_POLL_MAX_WAIT": "2m", "JOBLIB_INTERNAL_TASK_TIMEOUT": "90m",
			"JOBLIB_PROVIDER_LONG_POLL_DEFAULT": "0s", "JOBLIB_PROVIDER_LONG_POLL_MAX": "45s",
		}, func(c Config) bool {
			s := c.Settings
			return s.SweeperInterval == 5*time.Second && s.LongPollMaxWait == 2*time.Minute && s.InternalTaskTimeout == 90*time.Minute &&
				s.ProviderLongPollDefault == 0 && s.ProviderLongPollMax == 45*time.Second
		}},
		{map[string]string{"JOBLIB_PUBLIC_READS": "true", "JOBLIB_MAX_BODY_BYTES": "1024", "JOBLIB_LISTEN_ADDR": "127.0.0.1:9"}, func(c Config) bool {
			return c.Server.PublicReads && c.Server.MaxBodyBytes == 1024 && c.Server.ListenAddr == "127.0.0.1:9"
		}},
		{map[string]string{"JOBLIB_DATABASE_URL": "postgres://u@h/db", "JOBLIB_LOG_LEVEL": "debug", "JOBLIB_LOG_FORMAT": "json"}, func(c Config) bool {
			return c.DatabaseURL == "postgres://u@h/db" && c.LogLevel == "debug" && c.LogFormat == "json"
		}},
		// 0 keeps finished tasks forever.
		{map[string]string{"JOBLIB_TASK_RETENTION_COMPLETED": "0", "JOBLIB_TASK_RETENTION_FAILED": "720h", "JOBLIB_TASK_RETENTION_BATCH": "50"}, func(c Config) bool {
			s := c.Settings
			return s.TaskRetentionCompleted == 0 && s.TaskRetentionFailed == 720*time.Hour && s.TaskRetentionBatch == 50
		}},
		// Variables without the prefix are not read.
		{map[string]string{"WORKER_TIMEOUT": "1s"}, func(c Config) bool {
			return c.Settings.WorkerTimeout == 60*time.Second
		}},
	}
	for _, c := range cases {
		cfg, err := loadConfig(c.env)
		if err != nil {
			t.Errorf("%v: %v", c.env, err)
			continue
		}
		if !c.check(cfg) {
			t.Errorf("%v: config %+v", c.env, cfg)
		}
	}
}

// Invalid values fail start-up with an error that names the variable.
func TestConfigInvalidValuesNameTheVariable(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"JOBLIB_WORKER_TIMEOUT":              "abc",
		"JOBLIB_SWEEPER_INTERVAL":            "30 seconds",
		"JOBLIB_INTERNAL_TASK_TIMEOUT":       "-1h",
		"JOBLIB_LONG_POLL_MAX_WAIT":          "-5s",
		"JOBLIB_PROVIDER_RESULT_TTL":         "0s",
		"JOBLIB_PROVIDER_LONG_POLL_MAX":      "soon",
		"JOBLIB_ALLOWED_CATEGORIES":          `["custom"`,
		"JOBLIB_ALLOWED_PROVIDER_CATEGORIES": `[1, 2]`,
		"JOBLIB_MAX_BODY_BYTES":              "-1",
		"JOBLIB_PUBLIC_READS":                "maybe",
		"JOBLIB_LOG_LEVEL":                   "loud",
		"JOBLIB_LOG_FORMAT":                  "xml",
		"JOBLIB_SHUTDOWN_TIMEOUT":            "0s",
		"JOBLIB_TASK_RETENTION_COMPLETED":    "-1h",
		"JOBLIB_TASK_RETENTION_FAILED":       "a week",
		"JOBLIB_TASK_RETENTION_BATCH":        "0",
		"JOBLIB_TRUSTED_PROXIES":             "10.0.0.0/8,10.1.0.0/33",
	}
	for name, value := range cases {
		_, err := loadConfig(map[string]string{name: value})
		if err == nil {
			t.Errorf("%s=%q accepted", name, value)
			continue
		}
		if !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%q: error %q does not name the variable", name, value, err)
		}
	}
	// An empty category list leaves registration impossible.
	if _, err := loadConfig(map[string]string{"JOBLIB_ALLOWED_CATEGORIES": "[]"}); err == nil || !strings.Contains(err.Error(), "JOBLIB_ALLOWED_CATEGORIES") {
		t.Errorf("empty category list: %v", err)
	}
}

// A shorter worker timeout needs no other setting: the socket keep-alive
// follows it, and only an explicit keep-alive at or above it is refused.
func TestConfigKeepAliveFollowsWorkerTimeout(t *testing.T) {
	t.Parallel()
	if _, err := loadConfig(map[string]string{"JOBLIB_WORKER_TIMEOUT": "6s"}); err != nil {
		t.Fatalf("a 6s worker timeout alone was refused: %v", err)
	}
	_, err := loadConfig(map[string]string{"JOBLIB_WORKER_TIMEOUT": "6s", "JOBLIB_SOCKET_KEEPALIVE_INTERVAL": "6s"})
	if err == nil || !strings.Contains(err.Error(), "JOBLIB_SOCKET_KEEPALIVE_INTERVAL") {
		t.Fatalf("keep-alive equal to the worker timeout: %v, want an error naming the variable", err)
	}
}

// The credential, room authorization and quota variables are read, have
// their documented defaults, and bad values stop start-up naming the
// variable.
func TestConfigCredentials(t *testing.T) {
	t.Parallel()
	def, err := loadConfig(map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	s, st := def.Server, def.Settings
	if s.JWTAudience != "fastapi-users:auth" || s.JWTAlgorithm != "HS256" || s.JWTLeeway != 30*time.Second || s.CredentialCacheTTL != 5*time.Second ||
		s.RoomAuth.URL != "" || s.RoomAuth.Timeout != 2*time.Second || s.RoomAuth.CacheTTL != 5*time.Second || s.RoomAuth.CacheSize != 10000 || s.RoomAuth.FailOpen || s.RoomAuth.OutageGrace != 5*time.Minute || s.RoomAuth.Rate != 50 || s.RoomAuth.Burst != 500 || s.AuthFailureRate != 50 || s.AuthFailureBurst != 500 ||
		st.UserMaxWorkers != 1000 || st.UserMaxProviders != 1000 || st.UserMaxPendingTasks != 100000 {
		t.Fatalf("defaults %+v %+v", s, st)
	}
	cfg, err := loadConfig(map[string]string{
		"JOBLIB_JWT_AUDIENCE": "aud", "JOBLIB_JWT_ISSUER": "iss", "JOBLIB_JWT_ALGORITHM": "HS512", "JOBLIB_JWT_SUPERUSER_CLAIM": "is_superuser",
		"JOBLIB_ALLOWED_ORIGINS": "app.example.com,*.example.org", "JOBLIB_ROOM_AUTH_URL": "http://host/rooms", "JOBLIB_ROOM_AUTH_FAIL_OPEN": "true",
		"JOBLIB_ROOM_AUTH_CACHE_TTL": "1s", "JOBLIB_ROOM_AUTH_OUTAGE_GRACE": "0s", "JOBLIB_USER_MAX_WORKERS": "0", "JOBLIB_CREDENTIAL_CACHE_TTL": "0s",
		"JOBLIB_TRUSTED_PROXIES": "10.0.0.0/8, fd00::/8",
	})
	if err != nil {
		t.Fatal(err)
	}
	s = cfg.Server
	if s.JWTAudience != "aud" || s.JWTIssuer != "iss" || s.JWTAlgorithm != "HS512" || s.JWTSuperuserClaim != "is_superuser" ||
		!reflect.DeepEqual(s.AllowedOrigins, []string{"app.example.com", "*.example.org"}) || s.RoomAuth.URL != "http://host/rooms" ||
		!s.RoomAuth.FailOpen || s.RoomAuth.CacheTTL != time.Second || s.RoomAuth.OutageGrace != 0 || cfg.Settings.UserMaxWorkers != 0 || s.CredentialCacheTTL != 0 ||
		len(s.TrustedProxies) != 2 {
		t.Fatalf("parsed %+v", s)
	}
	for name, val := range map[string]string{
		"JOBLIB_JWT_ALGORITHM":          "RS256",
		"JOBLIB_ROOM_AUTH_URL":          "ftp://x",
		"JOBLIB_USER_MAX_PENDING_TASKS": "-1",
		"JOBLIB_JWT_LEEWAY":             "1h",
		"JOBLIB_CREDENTIAL_CACHE_TTL":   "-1s",
	} {
		if _, err := loadConfig(map[string]string{name: val}); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%s: %v", name, val, err)
		}
	}
}

// The cluster variables: defaults, and bad values named in the error.
func TestConfigClusterVariables(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Settings.NodeLeaseTimeout != 10*time.Second || cfg.BusURL != "" || cfg.BusSubject != "joblib.events" || cfg.NodeAddr != "" {
		t.Fatalf("defaults: lease %s, bus %q %q, addr %q", cfg.Settings.NodeLeaseTimeout, cfg.BusURL, cfg.BusSubject, cfg.NodeAddr)
	}
	cfg, err = loadConfig(map[string]string{"JOBLIB_BUS_URL": "nats://a:4222,nats://b:4222", "JOBLIB_NODE_LEASE_TIMEOUT": "3s"})
	if err != nil || cfg.Settings.NodeLeaseTimeout != 3*time.Second {
		t.Fatalf("valid values: %v %+v", err, cfg.Settings.NodeLeaseTimeout)
	}
	for k, v := range map[string]string{
		"JOBLIB_BUS_URL":            "redis://localhost:6379",
		"JOBLIB_NODE_LEASE_TIMEOUT": "0s",
	} {
		if _, err := loadConfig(map[string]string{k: v}); err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=%s: %v, want an error naming the variable", k, v, err)
		}
	}
	if _, err := loadConfig(map[string]string{"JOBLIB_BUS_URL": "nats://a:4222", "JOBLIB_BUS_SUBJECT": "joblib.*"}); err == nil || !strings.Contains(err.Error(), "JOBLIB_BUS_SUBJECT") {
		t.Errorf("wildcard subject: %v", err)
	}
}

// A deployment configured for the Python server works as it is: durations
// are also bare numbers of seconds, booleans also yes/no, and a bad value's
// error says the expected form with an example, never a Go type.
func TestConfigFormsOfAPythonDeployment(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(map[string]string{"JOBLIB_WORKER_TIMEOUT": "60", "JOBLIB_SWEEPER_INTERVAL": "0.5",
		"JOBLIB_PUBLIC_READS": "yes", "JOBLIB_BUILTIN_JOBS": "1", "JOBLIB_NOTIFY_AFTER_COMMIT": "No", "JOBLIB_TASK_RETENTION_FAILED": "1h"})
	if err != nil {
		t.Fatal(err)
	}
	if s := cfg.Settings; s.WorkerTimeout != time.Minute || s.SweeperInterval != 500*time.Millisecond || s.TaskRetentionFailed != time.Hour ||
		!cfg.Server.PublicReads || !cfg.BuiltinJobs || s.NotifyAfterCommit {
		t.Fatalf("config %+v", cfg)
	}
	for _, c := range []struct{ name, value, want string }{
		{"JOBLIB_WORKER_TIMEOUT", "abc", "90s"},
		{"JOBLIB_WORKER_TIMEOUT", "NaN", "90s"},
		{"JOBLIB_PUBLIC_READS", "maybe", "true or false"},
		{"JOBLIB_MAX_BODY_BYTES", "8MB", "whole number"},
		{"JOBLIB_SUBMIT_RATE", "fast", "a number, e.g."},
		{"JOBLIB_ALLOWED_CATEGORIES", `[1, 2]`, `["modifiers","analysis"]`},
	} {
		_, err := loadConfig(map[string]string{c.name: c.value})
		if err == nil {
			t.Errorf("%s=%q accepted", c.name, c.value)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, c.name) || !strings.Contains(msg, c.want) {
			t.Errorf("%s=%q: %q, want the variable and %q", c.name, c.value, msg, c.want)
		}
		for _, goSpeak := range []string{"time.Duration", "strconv", "int64", "float64", "bool value", "Go value", "[]string"} {
			if strings.Contains(msg, goSpeak) {
				t.Errorf("%s=%q: %q speaks Go (%s)", c.name, c.value, msg, goSpeak)
			}
		}
	}
}

// The zndraw-joblib variables are read as aliases (names in any case, as
// pydantic-settings reads them), each with a warning naming joblib's
// variable; joblib's own wins when both are set. The examples' client
// variables are known and draw no warning.
func TestConfigZnDrawAliases(t *testing.T) {
	t.Parallel()
	environ := map[string]string{
		"ZNDRAW_JOBLIB_WORKER_TIMEOUT_SECONDS":        "120",
		"zndraw_joblib_allowed_categories":            `["custom"]`,
		"ZNDRAW_JOBLIB_ALLOWED_PROVIDER_CATEGORIES":   "null",
		"ZNDRAW_JOBLIB_PROVIDER_RESULT_TTL_SECONDS":   "600",
		"ZNDRAW_JOBLIB_SWEEPER_INTERVAL_SECONDS":      "5",
		"JOBLIB_SWEEPER_INTERVAL":                     "7s",
		"ZNDRAW_JOBLIB_CLAIM_MAX_ATTEMPTS":            "20",
		"ZNDRAW_JOBLIB_INTERNAL_TASK_TIMEOUT_SECONDS": "90",
	}
	cfg, err := loadConfig(environ)
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.Settings
	if s.WorkerTimeout != 2*time.Minute || !reflect.DeepEqual(s.AllowedCategories, joblib.List{"custom"}) || len(s.AllowedProviderCategories) != 0 ||
		s.ProviderResultTTL != 10*time.Minute || s.SweeperInterval != 7*time.Second || s.InternalTaskTimeout != 90*time.Second {
		t.Fatalf("settings %+v", s)
	}
	_, warnings := resolveAliases(environ)
	all := strings.Join(warnings, "\n")
	for _, want := range []string{
		"ZNDRAW_JOBLIB_WORKER_TIMEOUT_SECONDS is read as JOBLIB_WORKER_TIMEOUT; set JOBLIB_WORKER_TIMEOUT instead",
		"zndraw_joblib_allowed_categories is read as JOBLIB_ALLOWED_CATEGORIES",
		"ZNDRAW_JOBLIB_SWEEPER_INTERVAL_SECONDS is ignored: JOBLIB_SWEEPER_INTERVAL is set and wins",
		"ZNDRAW_JOBLIB_CLAIM_MAX_ATTEMPTS is ignored",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("no warning %q in:\n%s", want, all)
		}
	}
	if len(warnings) != len(environ)-1 {
		t.Errorf("%d warnings for %d aliases:\n%s", len(warnings), len(environ)-1, all)
	}
	if w := unknownVariables(map[string]string{"JOBLIB_CLIENT_URL": "http://h:8080", "JOBLIB_CLIENT_TOKEN": "jl_x", "JOBLIB_URL": "u", "JOBLIB_TOKEN": "t"}); len(w) != 0 {
		t.Errorf("client variables warned about: %v", w)
	}
}
