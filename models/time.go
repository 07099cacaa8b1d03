package models

import (
	"database/sql/driver"
	"fmt"
	"time"
)

// Time is a timestamp read from either database: PostgreSQL returns timestamptz,
// SQLite stores fixed-width UTC text written by the database clock. The zero
// value means NULL.
type Time struct {
	time.Time
}

// Valid reports whether the value was not NULL.
func (t Time) Valid() bool { return !t.IsZero() }

// Ptr returns nil for NULL, else the UTC time.
func (t Time) Ptr() *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

var timeLayouts = []string{
	"2006-01-02T15:04:05.999999999Z07:00",
	"2006-01-02 15:04:05.999999999Z07:00",
	"2006-01-02 15:04:05.999999999-07:00",
	"2006-01-02T15:04:05.999999999",
	"2006-01-02 15:04:05.999999999",
}

// Scan implements sql.Scanner.
func (t *Time) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		t.Time = time.Time{}
		return nil
	case time.Time:
		t.Time = v.UTC()
		return nil
	case string:
		return t.parse(v)
	case []byte:
		return t.parse(string(v))
	}
	return fmt.Errorf("scan time from %T", src)
}

func (t *Time) parse(s string) error {
	for _, l := range timeLayouts {
		if p, err := time.Parse(l, s); err == nil {
			t.Time = p.UTC()
			return nil
		}
	}
	return fmt.Errorf("parse time %q", s)
}

// Value implements driver.Valuer; it writes the SQLite text form, which
// PostgreSQL also accepts for timestamptz.
func (t Time) Value() (driver.Value, error) {
	if t.IsZero() {
		return nil, nil
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z"), nil
}
