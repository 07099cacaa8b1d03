package models

import (
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"gorm.io/gorm"
	"gorm.io/gorm/callbacks"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/logger"
	"gorm.io/gorm/migrator"
	"gorm.io/gorm/schema"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// sqliteDialector is gorm's Dialector for SQLite through modernc.org/sqlite
// (the pure-Go SQLite, driver name "sqlite"). It covers what joblib asks of
// gorm: Raw and Exec with "?" placeholders, transactions, and errors
// translated to gorm's. joblib writes all its SQL by hand and migrates with
// its own scripts (migrate.go), so gorm's query builder and migrator get only
// the basics.
type sqliteDialector struct {
	// DSN opens a new database: the file path, then modernc's parameters
	// (?_pragma=...). Each connection caches its compiled statements.
	DSN string
	// Conn, if set, is used instead of opening DSN.
	Conn gorm.ConnPool
}

// Name is the dialect's name in gorm.
func (sqliteDialector) Name() string { return "sqlite" }

// Initialize registers gorm's callbacks with the clauses SQLite supports
// (RETURNING since 3.35) and opens the database.
func (d sqliteDialector) Initialize(db *gorm.DB) error {
	callbacks.RegisterDefaultCallbacks(db, &callbacks.Config{
		CreateClauses: []string{"INSERT", "VALUES", "ON CONFLICT", "RETURNING"},
		UpdateClauses: []string{"UPDATE", "SET", "FROM", "WHERE", "RETURNING"},
		DeleteClauses: []string{"DELETE", "FROM", "WHERE", "RETURNING"},
		// SQLite's last insert id is that of the last row of a multi-row
		// insert.
		LastInsertIDReversed: true,
	})
	if d.Conn != nil {
		db.ConnPool = d.Conn
		return nil
	}
	c, err := sqlite.NewConnector(d.DSN)
	if err != nil {
		return err
	}
	db.ConnPool = sql.OpenDB(stmtCacheConnector{Connector: c, size: stmtCacheSize})
	return nil
}

// Migrator is gorm's generic migrator. joblib never uses it (its schema is
// its own SQL, migrate.go); it is here because a Dialector must have one.
func (d sqliteDialector) Migrator(db *gorm.DB) gorm.Migrator {
	return migrator.Migrator{Config: migrator.Config{DB: db, Dialector: d, CreateIndexAfterCreateTable: true}}
}

// DataTypeOf names SQLite's column type for a gorm field (for the migrator
// only). Times are TEXT, as joblib stores them.
func (sqliteDialector) DataTypeOf(field *schema.Field) string {
	switch field.DataType {
	case schema.Bool:
		return "BOOLEAN"
	case schema.Int, schema.Uint:
		return "INTEGER"
	case schema.Float:
		return "REAL"
	case schema.String, schema.Time:
		return "TEXT"
	case schema.Bytes:
		return "BLOB"
	}
	return string(field.DataType)
}

// DefaultValueOf is the DEFAULT of a field without one.
func (sqliteDialector) DefaultValueOf(*schema.Field) clause.Expression {
	return clause.Expr{SQL: "NULL"}
}

// BindVarTo writes a parameter placeholder.
func (sqliteDialector) BindVarTo(w clause.Writer, _ *gorm.Statement, _ any) {
	w.WriteByte('?')
}

// QuoteTo writes an identifier, each dotted part in backquotes (a backquote
// inside is doubled).
func (sqliteDialector) QuoteTo(w clause.Writer, name string) {
	for i, part := range strings.Split(name, ".") {
		if i > 0 {
			w.WriteByte('.')
		}
		w.WriteByte('`')
		w.WriteString(strings.ReplaceAll(part, "`", "``"))
		w.WriteByte('`')
	}
}

// Explain renders sql with its arguments inlined, for logs. joblib's logger
// never asks for it (gormLogger.ParamsFilter drops arguments).
func (sqliteDialector) Explain(sql string, vars ...any) string {
	return logger.ExplainSQL(sql, nil, `'`, vars...)
}

// Translate implements gorm.ErrorTranslator (gorm.Config.TranslateError):
// unique and primary-key violations become gorm.ErrDuplicatedKey, foreign-key
// violations gorm.ErrForeignKeyViolated, both still wrapping SQLite's error
// (its text names the constraint). Other errors pass unchanged.
func (sqliteDialector) Translate(err error) error {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return err
	}
	switch se.Code() { // the extended result code
	case sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
		return fmt.Errorf("%w: %w", gorm.ErrDuplicatedKey, err)
	case sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY:
		return fmt.Errorf("%w: %w", gorm.ErrForeignKeyViolated, err)
	}
	return err
}
