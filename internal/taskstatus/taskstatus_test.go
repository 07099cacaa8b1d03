package taskstatus_test

import (
	"slices"
	"testing"

	"github.com/zndraw/joblib/internal/taskstatus"
)

// TestVocabulary: the wire and database strings existing workers and the
// stored rows use, and the state machine over them: a report may move a
// task only along these edges, and a final status has none.
func TestVocabulary(t *testing.T) {
	if got := taskstatus.All; !slices.Equal(got, []string{"pending", "claimed", "running", "completed", "failed", "cancelled"}) {
		t.Fatalf("statuses %q", got)
	}
	edges := map[[2]string]bool{
		{"pending", "claimed"}: true, {"pending", "cancelled"}: true,
		{"claimed", "running"}: true, {"claimed", "failed"}: true, {"claimed", "cancelled"}: true,
		{"running", "completed"}: true, {"running", "failed"}: true, {"running", "cancelled"}: true,
	}
	for _, from := range taskstatus.All {
		if !taskstatus.Valid(from) {
			t.Errorf("%s not valid", from)
		}
		if taskstatus.Terminal(from) != (len(taskstatus.Next(from)) == 0) {
			t.Errorf("%s: terminal %v but next %q", from, taskstatus.Terminal(from), taskstatus.Next(from))
		}
		for _, to := range taskstatus.All {
			if got, want := taskstatus.Allowed(from, to), edges[[2]string{from, to}]; got != want {
				t.Errorf("%s -> %s allowed %v, want %v", from, to, got, want)
			}
		}
	}
	for _, s := range []string{"", "Pending", "done", "canceled"} {
		if taskstatus.Valid(s) {
			t.Errorf("%q valid", s)
		}
	}
}
