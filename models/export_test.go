package models

// ExecRaw runs one statement of the test's own. Tests use it to put rows in
// states the package's API does not produce (a heartbeat aged by SQL that
// does not go through the code under test, a row lock held elsewhere).
func (db *DB) ExecRaw(sql string, args ...any) error {
	return db.gorm.Exec(sql, args...).Error
}

// Statements exposed to the external tests that read their plans.
var (
	ClaimSQL       = claimSQL
	UpdateBatchSQL = updateBatchSQL
	UpdateOneSQL   = updateOneSQL
	TaskSelectSQL  = taskSelect
	TasksSelectSQL = tasksSelect
)

// Args is the parameter list a HotNotify adds to a hot statement.
func (h HotNotify) Args() []any { return h.args() }
