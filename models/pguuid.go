package models

import (
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// pgx knows google/uuid's UUID only as a driver.Valuer and an sql.Scanner:
// every id a hot statement sends became a string and was parsed back, and
// every id it read was printed and parsed. These were about 8 % of the
// server's CPU in bench/claim. uuidCodec moves the 16 bytes directly, in
// the binary format pgx uses for prepared statements (and the text format
// for the rest).

// registerUUID teaches conn's type map uuid.UUID, for uuid and uuid[].
func registerUUID(conn *pgx.Conn) {
	m := conn.TypeMap()
	t := &pgtype.Type{Name: "uuid", OID: pgtype.UUIDOID, Codec: uuidCodec{}}
	m.RegisterType(t)
	m.RegisterType(&pgtype.Type{Name: "_uuid", OID: pgtype.UUIDArrayOID, Codec: &pgtype.ArrayCodec{ElementType: t}})
	// Where the statement does not say (the simple protocol), the Go type
	// names the PostgreSQL one.
	m.RegisterDefaultPgType(uuid.UUID{}, "uuid")
	m.RegisterDefaultPgType([]uuid.UUID{}, "_uuid")
}

// uuidCodec is pgx's UUID codec with plans of its own for uuid.UUID.
type uuidCodec struct{ pgtype.UUIDCodec }

func (c uuidCodec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if _, ok := value.(uuid.UUID); ok {
		return uuidPlan(format)
	}
	return c.UUIDCodec.PlanEncode(m, oid, format, value)
}

func (c uuidCodec) PlanScan(m *pgtype.Map, oid uint32, format int16, target any) pgtype.ScanPlan {
	if _, ok := target.(*uuid.UUID); ok {
		return uuidPlan(format)
	}
	return c.UUIDCodec.PlanScan(m, oid, format, target)
}

// uuidPlan encodes a uuid.UUID and scans into a *uuid.UUID, in its format.
type uuidPlan int16

func (f uuidPlan) Encode(value any, buf []byte) ([]byte, error) {
	id := value.(uuid.UUID)
	if f == pgtype.BinaryFormatCode {
		return append(buf, id[:]...), nil
	}
	return append(buf, id.String()...), nil
}

func (f uuidPlan) Scan(src []byte, target any) error {
	dst := target.(*uuid.UUID)
	if src == nil {
		return fmt.Errorf("cannot scan NULL into %T", target)
	}
	if f == pgtype.BinaryFormatCode {
		if len(src) != 16 {
			return fmt.Errorf("invalid length for uuid: %d", len(src))
		}
		copy(dst[:], src)
		return nil
	}
	id, err := uuid.ParseBytes(src)
	if err != nil {
		return err
	}
	*dst = id
	return nil
}
