package main

import (
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const modulePath = "github.com/zndraw/joblib/"

// TestArchitectureDiagram: docs/architecture.md lists every package of the
// module (those with non-test Go files) with its purpose, and its import
// list names, for each, exactly the module's packages it imports. A package
// added, removed, or an import added or dropped without the document fails
// here, so the diagram a new maintainer reads is the code's.
func TestArchitectureDiagram(t *testing.T) {
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}}|{{len .GoFiles}}|{{join .Imports \" \"}}", "./...")
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "GOTOOLCHAIN=local")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	code := map[string][]string{}
	for line := range strings.Lines(strings.TrimSpace(string(out))) {
		parts := strings.SplitN(strings.TrimSpace(line), "|", 3)
		if len(parts) != 3 || parts[1] == "0" {
			continue // a package of tests only (deploy, examples)
		}
		pkg := strings.TrimPrefix(parts[0], modulePath)
		deps := []string{}
		for imp := range strings.FieldsSeq(parts[2]) {
			if rest, ok := strings.CutPrefix(imp, modulePath); ok {
				deps = append(deps, rest)
			}
		}
		slices.Sort(deps)
		code[pkg] = deps
	}
	raw, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	_, block, ok := strings.Cut(text, "<!-- imports: checked by TestArchitectureDiagram -->")
	if !ok {
		t.Fatal("docs/architecture.md has no import list marker")
	}
	_, block, _ = strings.Cut(block, "```\n")
	block, _, _ = strings.Cut(block, "```")
	doc := map[string][]string{}
	for line := range strings.Lines(block) {
		pkg, deps, ok := strings.Cut(line, "→")
		if !ok {
			continue
		}
		pkg = strings.TrimSpace(pkg)
		list := []string{}
		if d := strings.TrimSpace(deps); d != "" && d != "-" {
			for _, dep := range strings.Split(d, ",") {
				list = append(list, strings.TrimSpace(dep))
			}
		}
		slices.Sort(list)
		if _, dup := doc[pkg]; dup {
			t.Errorf("import list names %s twice", pkg)
		}
		doc[pkg] = list
	}
	for _, pkg := range slices.Sorted(maps.Keys(code)) {
		d, listed := doc[pkg]
		switch {
		case !listed:
			t.Errorf("package %s (imports %v) is missing from the import list in docs/architecture.md", pkg, code[pkg])
		case !slices.Equal(d, code[pkg]):
			t.Errorf("%s: the document says it imports %v, the code imports %v", pkg, d, code[pkg])
		}
	}
	for pkg := range doc {
		if _, ok := code[pkg]; !ok {
			t.Errorf("the import list names %s, which is no package (with non-test files) of the module", pkg)
		}
	}
	// Each package's purpose: one row of the package table.
	rows := regexp.MustCompile("(?m)^\\| `([a-z0-9/._-]+)` \\| [^|]*\\S[^|]* \\|$").FindAllStringSubmatch(text, -1)
	purpose := map[string]int{}
	for _, r := range rows {
		purpose[r[1]]++
	}
	for pkg := range code {
		if purpose[pkg] != 1 {
			t.Errorf("package %s has %d rows in the package table of docs/architecture.md, want 1", pkg, purpose[pkg])
		}
	}
}

// TestDialectStaysInModels: outside models no code asks which database it
// runs on (a Dialect comparison, models.Postgres or models.SQLite, a nil
// check of the pgx pool) or which bus it has (a *events.PGBus assertion):
// it asks models.DB.Caps or events.DeliversInOneOrder, named for what it
// needs. Tests, internal/dbtest and the benchmarks may pick a dialect.
func TestDialectStaysInModels(t *testing.T) {
	banned := regexp.MustCompile(`\.Dialect\(\)\s*[!=]=|models\.(Postgres|SQLite)\b|\.Pool\s*[!=]=\s*nil|\.\(\*(events\.)?PGBus\)`)
	for _, dir := range []string{"client", "cmd", "events", "joblib", "server", "web", "internal"} {
		err := filepath.WalkDir(filepath.Join("../..", dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && strings.HasSuffix(path, filepath.Join("internal", "dbtest")) {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for i, line := range strings.Split(string(b), "\n") {
				code := strings.TrimSpace(line)
				if strings.HasPrefix(code, "//") || !banned.MatchString(code) {
					continue
				}
				t.Errorf("%s:%d asks which database or bus it runs on: %s (use models.DB.Caps or events.DeliversInOneOrder)", path, i+1, code)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
