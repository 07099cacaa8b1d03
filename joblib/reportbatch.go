package joblib

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/models"
)

// Group commit of status reports (see groupCommit). The contract has every
// task reported one PATCH at a time (running, then completed). A batch
// holds reports of one user (the statement checks one owner) and of
// distinct tasks; each report gets the row its task changed, or none (the
// general path then answers it, as for a lone report).

// maxReportBatch is the most reports one group commit sends.
const maxReportBatch = 64

type reportBatcher struct {
	*groupCommit[uuid.UUID, models.HotUpdate, *models.HotTask]
}

func newReportBatcher(run func(context.Context, uuid.UUID, []models.HotUpdate) ([]models.HotTask, error), delay func() time.Duration) *reportBatcher {
	byTask := func(ctx context.Context, user uuid.UUID, ups []models.HotUpdate) ([]*models.HotTask, error) {
		hts, err := run(ctx, user, ups)
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

// report sends up, a report of one of user's workers, with whatever other
// reports of user are waiting, and returns the row it changed (nil when it
// changed nothing).
func (b *reportBatcher) report(ctx context.Context, user uuid.UUID, up models.HotUpdate) (*models.HotTask, error) {
	return b.call(ctx, user, up)
}
