// Package models owns the database: the gorm structs, the versioned migrations and
// every query joblib runs. It is the only package that knows SQL or which database
// it talks to (PostgreSQL through pgx, or embedded SQLite): other packages ask
// DB.Caps what the database can do, never which it is. Driver errors leave this
// package as ErrNotFound or ErrConflict; liveness comparisons are computed in SQL
// with the database's clock, never with a node's.
package models
