package main

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/zndraw/joblib/joblib"
	"github.com/zndraw/joblib/server"
)

// Every default lives in one place and the others agree with it: the Go
// Default*Config values are the truth (the socket layer's built from the
// sio/engineio constants), the env tags' envDefault must give exactly those
// values, and every default docs/configuration.md states must be what the
// variable defaults to (setting a variable to its documented default
// changes nothing).
func TestDefaultsAgree(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	same := func(what string, fromEnv, fromGo any) {
		ev, gv := reflect.ValueOf(fromEnv), reflect.ValueOf(fromGo)
		for i := range ev.NumField() {
			f := ev.Type().Field(i)
			if !reflect.DeepEqual(ev.Field(i).Interface(), gv.Field(i).Interface()) {
				t.Errorf("%s.%s (env %q, envDefault %q) is %v, the Go default %v", what, f.Name, f.Tag.Get("env"), f.Tag.Get("envDefault"),
					ev.Field(i).Interface(), gv.Field(i).Interface())
			}
		}
	}
	same("server.RealtimeConfig", cfg.Realtime, server.DefaultRealtimeConfig())
	same("server.Config", cfg.Server, server.DefaultConfig())
	same("joblib.Settings", cfg.Settings, joblib.DefaultSettings())

	conf, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	// "| `JOBLIB_X` | `value` |" and "| `JOBLIB_A`, `JOBLIB_B` | `1`, `2` |",
	// in either table; rows whose default is prose are not checked.
	row := regexp.MustCompile("\\| ((?:`JOBLIB_[A-Z0-9_]+`(?:, )?)+) \\| ((?:`[^`|]*`(?:, )?)+)[^|]*\\|")
	tick := regexp.MustCompile("`([^`]*)`")
	checked := 0
	for _, m := range row.FindAllStringSubmatch(string(conf), -1) {
		vars, vals := tick.FindAllStringSubmatch(m[1], -1), tick.FindAllStringSubmatch(m[2], -1)
		if len(vars) != len(vals) {
			t.Errorf("docs/configuration.md: %d variables, %d defaults in %q", len(vars), len(vals), m[0])
			continue
		}
		for i, v := range vars {
			name, val := v[1], vals[i][1]
			with, err := loadConfig(map[string]string{name: val})
			if err != nil {
				t.Errorf("docs/configuration.md: %s's documented default %q is refused: %v", name, val, err)
				continue
			}
			if !reflect.DeepEqual(with, cfg) {
				t.Errorf("docs/configuration.md: %s's documented default %q is not its default", name, val)
			}
			checked++
		}
	}
	t.Logf("%d documented defaults checked", checked)
	if checked < 60 {
		t.Fatalf("only %d documented defaults checked: has the table's form changed?", checked)
	}
	if !strings.Contains(string(conf), "`JOBLIB_SOCKET_CONNECT_TIMEOUT`") {
		t.Fatal("JOBLIB_SOCKET_CONNECT_TIMEOUT is not documented")
	}
}
