package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docFiles are the documents a clone ships: README.md and docs/*.md.
func docFiles(t *testing.T) map[string]string {
	t.Helper()
	files := map[string]string{}
	paths, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range append(paths, "../../README.md", "../../CHANGELOG.md") {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files[p] = string(b)
	}
	return files
}

var mdLink = regexp.MustCompile(`\]\(([^)#\s]+)(#[^)]*)?\)`)

// The documentation stands alone in a clone: no link leaves the repository
// for a sibling directory, and every relative link names a file that
// exists.
func TestDocsStandAlone(t *testing.T) {
	t.Parallel()
	for path, text := range docFiles(t) {
		if strings.Contains(text, "../shared") {
			t.Errorf("%s refers to ../shared, which a clone does not have", path)
		}
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(path), target)); err != nil {
				t.Errorf("%s links to %s: %v", path, target, err)
			}
		}
	}
	for _, must := range []string{"../../LICENSE", "../../docs/quickstart.md", "../../docs/api.md", "../../docs/configuration.md",
		"../../docs/operations.md", "../../docs/architecture.md"} {
		if _, err := os.Stat(must); err != nil {
			t.Error(err)
		}
	}
}

// Every JOBLIB_ variable joblib reads is documented (README.md or docs/),
// and every one documented is read: a renamed variable cannot linger in
// the docs.
func TestEveryVariableDocumented(t *testing.T) {
	t.Parallel()
	var all strings.Builder
	for _, text := range docFiles(t) {
		all.WriteString(text)
	}
	docs := all.String()
	known := knownVariables()
	for _, v := range known {
		if v == "JOBLIB_TEST_DATABASE_URL" {
			continue
		}
		if !strings.Contains(docs, "`"+v+"`") {
			t.Errorf("%s is not documented", v)
		}
	}
	conf, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile("(?m)^\\| `(JOBLIB_[A-Z0-9_]+)`").FindAllStringSubmatch(string(conf), -1) {
		found := false
		for _, v := range known {
			found = found || v == m[1]
		}
		if !found {
			t.Errorf("docs/configuration.md documents %s, which joblib does not read", m[1])
		}
	}
}
