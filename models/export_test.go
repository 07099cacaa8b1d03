package models

// Statements exposed to the external tests that read their plans.
var (
	ClaimSQL       = claimSQL
	TaskSelectSQL  = taskSelect
	TasksSelectSQL = tasksSelect
)

// Args is the parameter list a HotNotify adds to a hot statement.
func (h HotNotify) Args() []any { return h.args() }
