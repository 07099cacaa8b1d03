package models

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// ExecRaw runs one statement of the test's own. Tests use it to put rows in
// states the package's API does not produce (a heartbeat aged by SQL that
// does not go through the code under test, a row lock held elsewhere).
func (db *DB) ExecRaw(sql string, args ...any) error {
	return db.gorm.Exec(sql, args...).Error
}

// Statements exposed to the external tests that read their plans.
var (
	ClaimSQL      = claimSQL
	ClaimGroupSQL = claimGroupSQL
	// ClaimPlanSQL and ClaimGenericPlanSQL are the planner settings the
	// claims run under.
	ClaimPlanSQL        = claimPlanSQL
	ClaimGenericPlanSQL = claimGenericPlanSQL
	SubmitSQL           = submitSQL
	TaskSelectSQL       = taskSelect
	TasksSelectSQL      = tasksSelect
	// EarliestDeadlineSQL is the idle sweep's read of task deadlines.
	EarliestDeadlineSQL = earliestDeadlineSQL
	// NextRunAtSQL is the leader's read of the next delayed task.
	NextRunAtSQL = nextRunAtSQL[Postgres]
)

// ClaimGroupArgs are ClaimGroupSQL's arguments.
func ClaimGroupArgs(reqs []ClaimRequest, start bool, n HotNotify) pgx.NamedArgs {
	return claimGroupArgs(reqs, start, n)
}

// ClaimArgs are ClaimSQL's arguments.
func ClaimArgs(workerID, userID uuid.UUID, limit int, start bool, n HotNotify) pgx.NamedArgs {
	return claimArgs(workerID, userID, limit, start, n)
}

// SubmitArgs are SubmitSQL's arguments: a task of user createdBy for
// r:modifiers:<job> in room r, under quota.
func SubmitArgs(job string, createdBy uuid.UUID, quota int) pgx.NamedArgs {
	return submitArgs(uuid.New(), "r", "modifiers", job, "r", createdBy, "{}", nil, quota, HotNotify{}, AvailableFrame{})
}

// UpdateArgs are the arguments of UpdateOneSQL (one report) or
// UpdateBatchSQL, and which of the two.
func UpdateArgs(ups []HotUpdate, transitions []string, n HotNotify) (string, pgx.NamedArgs) {
	return updateArgs(ups, transitions, n)
}

// UUIDPlansDirect reports whether the pool's connections encode and scan
// uuid.UUID with joblib's own plans, not through strings.
func (db *DB) UUIDPlansDirect(ctx context.Context) (bool, error) {
	c, err := db.Pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer c.Release()
	m := c.Conn().TypeMap()
	_, enc := m.PlanEncode(pgtype.UUIDOID, pgtype.BinaryFormatCode, uuid.UUID{}).(uuidPlan)
	_, scan := m.PlanScan(pgtype.UUIDOID, pgtype.BinaryFormatCode, &uuid.UUID{}).(uuidPlan)
	return enc && scan, nil
}
