package main

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
)

// envParsers are the parsers of the configuration's value types (env's
// FuncMap): a duration also as a bare number of seconds, as the Python
// server's *_SECONDS settings are; a boolean also as yes/no; and errors that
// say the expected form with an example, never a Go type.
var envParsers = map[reflect.Type]env.ParserFunc{
	reflect.TypeFor[time.Duration](): func(v string) (any, error) { return parseDurationValue(v) },
	reflect.TypeFor[bool](): func(v string) (any, error) {
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "true", "1", "yes", "on":
			return true, nil
		case "false", "0", "no", "off":
			return false, nil
		}
		return nil, errors.New("must be true or false (also 1/0, yes/no)")
	},
	reflect.TypeFor[int](): func(v string) (any, error) {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return nil, errors.New("must be a whole number, e.g. 100")
		}
		return n, nil
	},
	reflect.TypeFor[int64](): func(v string) (any, error) {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return nil, errors.New("must be a whole number, e.g. 1048576")
		}
		return n, nil
	},
	reflect.TypeFor[float64](): func(v string) (any, error) {
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, errors.New("must be a number, e.g. 0.25")
		}
		return f, nil
	},
}

// errDurationForm names the accepted forms of a duration.
var errDurationForm = errors.New("must be a duration such as 90s, 1m30s or 500ms, or a number of seconds such as 90 or 0.5")

// parseDurationValue reads a duration in Go's syntax ("90s", "1m30s") or
// as a bare number of seconds ("90", "0.5").
func parseDurationValue(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if d, err := time.ParseDuration(v); err == nil {
		return d, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > float64(math.MaxInt64/int64(time.Second)) {
		return 0, errDurationForm
	}
	return time.Duration(f * float64(time.Second)), nil
}

// durationFlag is a command line duration accepting what the configuration
// accepts.
type durationFlag struct{ d *time.Duration }

func (f durationFlag) String() string {
	if f.d == nil {
		return ""
	}
	return f.d.String()
}

func (f durationFlag) Set(v string) error {
	d, err := parseDurationValue(v)
	if err != nil {
		return err
	}
	*f.d = d
	return nil
}

// zndrawPrefix starts the variables of the zndraw-joblib server.
const zndrawPrefix = "ZNDRAW_JOBLIB_"

// zndrawAliases maps the zndraw-joblib settings (the part after
// ZNDRAW_JOBLIB_) to joblib's variables. An empty target is a setting
// joblib has no use for.
var zndrawAliases = map[string]string{
	"ALLOWED_CATEGORIES":                 "JOBLIB_ALLOWED_CATEGORIES",
	"WORKER_TIMEOUT_SECONDS":             "JOBLIB_WORKER_TIMEOUT",
	"SWEEPER_INTERVAL_SECONDS":           "JOBLIB_SWEEPER_INTERVAL",
	"LONG_POLL_MAX_WAIT_SECONDS":         "JOBLIB_LONG_POLL_MAX_WAIT",
	"INTERNAL_TASK_TIMEOUT_SECONDS":      "JOBLIB_INTERNAL_TASK_TIMEOUT",
	"ALLOWED_PROVIDER_CATEGORIES":        "JOBLIB_ALLOWED_PROVIDER_CATEGORIES",
	"PROVIDER_RESULT_TTL_SECONDS":        "JOBLIB_PROVIDER_RESULT_TTL",
	"PROVIDER_INFLIGHT_TTL_SECONDS":      "JOBLIB_PROVIDER_INFLIGHT_TTL",
	"PROVIDER_LONG_POLL_DEFAULT_SECONDS": "JOBLIB_PROVIDER_LONG_POLL_DEFAULT",
	"PROVIDER_LONG_POLL_MAX_SECONDS":     "JOBLIB_PROVIDER_LONG_POLL_MAX",
	// Claims are one atomic statement here: no retry loop to tune.
	"CLAIM_MAX_ATTEMPTS":       "",
	"CLAIM_BASE_DELAY_SECONDS": "",
}

// resolveAliases returns environ with the zndraw-joblib variables (names
// matched case-insensitively, as pydantic-settings does) copied to joblib's
// names where those are not set, and one warning per alias naming the
// variable to use instead. joblib's own variable wins when both are set.
func resolveAliases(environ map[string]string) (map[string]string, []string) {
	var out map[string]string
	var warnings []string
	for k, v := range environ {
		up := strings.ToUpper(k)
		if !strings.HasPrefix(up, zndrawPrefix) {
			continue
		}
		target, known := zndrawAliases[strings.TrimPrefix(up, zndrawPrefix)]
		switch {
		case !known:
			warnings = append(warnings, fmt.Sprintf("%s is not a zndraw-joblib setting joblib knows; it is ignored", k))
			continue
		case target == "":
			warnings = append(warnings, fmt.Sprintf("%s is ignored: joblib claims tasks in one atomic statement, without a retry loop", k))
			continue
		}
		if _, set := environ[target]; set {
			warnings = append(warnings, fmt.Sprintf("%s is ignored: %s is set and wins", k, target))
			continue
		}
		if out == nil {
			out = make(map[string]string, len(environ))
			for ek, ev := range environ {
				out[ek] = ev
			}
		}
		if strings.TrimSpace(v) == "null" { // pydantic's None: unrestricted
			v = ""
		}
		out[target] = v
		warnings = append(warnings, fmt.Sprintf("%s is read as %s; set %s instead", k, target, target))
	}
	slices.Sort(warnings)
	if out == nil {
		return environ, warnings
	}
	return out, warnings
}
