package joblib

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/models"
)

// Group commit of claims (see groupCommit). Every worker of a fleet claims
// from the head of the same queue: one statement per claim, with its own
// start-up and commit, and concurrent claimers stepping over each other's
// locked rows. Claims of one claim mode that meet in the queue, of any
// users, go out as one statement (models.ClaimGroupHot), which checks each
// worker against its own request's user and hands each worker its own
// tasks; a lone claim runs the single claim statement.

// maxClaimGroup is the most claims one group statement carries.
const maxClaimGroup = 16

// claimKey is what the claims of one group share: whether they start their
// tasks.
type claimKey struct {
	start bool
}

// claimAnswer is a claim's outcome in a group: served false when the group
// statement left it to the caller (see models.ClaimAnswer); owned false
// when the worker is not the user's (the general path says why).
type claimAnswer struct {
	served, owned bool
	tasks         []models.HotTask
}

type claimBatcher struct {
	*groupCommit[claimKey, models.ClaimRequest, claimAnswer]
	db *models.DB
	n  func() models.HotNotify
}

func newClaimBatcher(db *models.DB, n func() models.HotNotify, delay func() time.Duration) *claimBatcher {
	b := &claimBatcher{db: db, n: n}
	b.groupCommit = newGroupCommit(maxClaimGroup, func(r models.ClaimRequest) uuid.UUID { return r.Worker }, delay, b.run)
	return b
}

// run sends one group: a lone claim as the single claim statement, more as
// one group statement.
func (b *claimBatcher) run(ctx context.Context, k claimKey, reqs []models.ClaimRequest) ([]claimAnswer, error) {
	out := make([]claimAnswer, len(reqs))
	if len(reqs) == 1 {
		owned, hts, err := b.db.ClaimTasksHot(ctx, reqs[0].Worker, reqs[0].User, reqs[0].Limit, k.start, b.n())
		out[0] = claimAnswer{served: true, owned: owned, tasks: hts}
		return out, err
	}
	as, err := b.db.ClaimGroupHot(ctx, reqs, k.start, b.n())
	if err != nil {
		return nil, err
	}
	for i, a := range as {
		out[i] = claimAnswer{served: a.Served, owned: a.Served, tasks: a.Tasks}
	}
	return out, nil
}

// claimHot claims for one of user's workers on the hot path, in a group
// with the claims that meet it, whoever's; a claim the group left alone runs
// on its own. owned is false when the worker is not the user's (or does not exist).
func (s *Service) claimHot(ctx context.Context, user, worker uuid.UUID, limit int, start bool) (owned bool, hts []models.HotTask, err error) {
	a, err := s.claims.call(ctx, claimKey{start: start}, models.ClaimRequest{Worker: worker, User: user, Limit: limit})
	if err != nil {
		return false, nil, err
	}
	if a.served {
		return a.owned, a.tasks, nil
	}
	return s.db.ClaimTasksHot(ctx, worker, user, limit, start, s.hotNotify())
}
