package joblib

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/models"
)

// Group commit of status reports (see groupCommit). The contract has every
// task reported one PATCH at a time (running, then completed). A batch
// holds reports of distinct tasks, of any users (the statement checks each
// report's task against its own user's workers): a fleet of many users'
// workers, one or two each, shares statements as one user's fleet does.
// Each report gets the row its task changed, or none (the general path
// then answers it, as for a lone report).

// maxReportBatch is the most reports one group commit sends.
const maxReportBatch = 64

type reportBatcher struct {
	*groupCommit[allReports, models.HotUpdate, *models.HotTask]
}

// allReports is the reports' one group-commit key.
type allReports struct{}

func newReportBatcher(run func(context.Context, []models.HotUpdate) ([]models.HotTask, error), delay func() time.Duration) *reportBatcher {
	byTask := func(ctx context.Context, _ allReports, ups []models.HotUpdate) ([]*models.HotTask, error) {
		hts, err := run(ctx, ups)
		if err != nil {
			return nil, err
		}
		byID := make(map[uuid.UUID]*models.HotTask, len(hts))
		for i := range hts {
			byID[hts[i].ID] = &hts[i]
		}
		out := make([]*models.HotTask, len(ups))
		for i, up := range ups {
			out[i] = byID[up.ID]
		}
		return out, nil
	}
	return &reportBatcher{newGroupCommit(maxReportBatch, func(up models.HotUpdate) uuid.UUID { return up.ID }, delay, byTask)}
}

// report sends up, a report by up.User's worker, with whatever other
// reports are waiting, and returns the row it changed (nil when it changed
// nothing).
func (b *reportBatcher) report(ctx context.Context, up models.HotUpdate) (*models.HotTask, error) {
	return b.call(ctx, allReports{}, up)
}
