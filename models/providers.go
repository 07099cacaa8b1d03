package models

import (
	"fmt"

	"github.com/google/uuid"
)

const (
	providerCols     = "p.id, p.seq, p.room_id, p.category, p.name, p.schema, p.content_type, p.user_id, p.worker_id, p.created_at"
	providerColsBare = "id, seq, room_id, category, name, schema, content_type, user_id, worker_id, created_at"
)

// InsertProviderIfAbsent inserts a provider unless one with the same (room,
// category, name) exists, and reports whether it inserted. Concurrent first
// registrations never fail: one inserts, the others find the row.
func (q *Q) InsertProviderIfAbsent(p Provider) (bool, error) {
	res := q.g.Exec("INSERT INTO providers (id, room_id, category, name, schema, content_type, user_id, worker_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, "+q.now()+
		") ON CONFLICT (room_id, category, name) DO NOTHING",
		p.ID, p.RoomID, p.Category, p.Name, p.Schema, p.ContentType, p.UserID, p.WorkerID)
	if res.Error != nil {
		return false, fmt.Errorf("insert provider: %w", mapErr(res.Error))
	}
	return res.RowsAffected == 1, nil
}

// ProviderByKey finds a provider by (room, category, name). With forUpdate
// the row stays locked until the transaction ends (PostgreSQL; SQLite's
// single writer serialises anyway).
func (q *Q) ProviderByKey(room, category, name string, forUpdate bool) (Provider, error) {
	lock := ""
	if forUpdate && q.d == Postgres {
		lock = " FOR UPDATE"
	}
	var ps []Provider
	err := q.g.Raw("SELECT "+providerCols+" FROM providers p WHERE p.room_id = ? AND p.category = ? AND p.name = ?"+lock, room, category, name).Scan(&ps).Error
	if err != nil {
		return Provider{}, fmt.Errorf("read provider: %w", mapErr(err))
	}
	if len(ps) == 0 {
		return Provider{}, ErrNotFound
	}
	return ps[0], nil
}

// GetProvider reads one provider by id.
func (q *Q) GetProvider(id uuid.UUID) (Provider, error) {
	var ps []Provider
	if err := q.g.Raw("SELECT "+providerCols+" FROM providers p WHERE p.id = ?", id).Scan(&ps).Error; err != nil {
		return Provider{}, fmt.Errorf("read provider: %w", mapErr(err))
	}
	if len(ps) == 0 {
		return Provider{}, ErrNotFound
	}
	return ps[0], nil
}

// UpdateProvider overwrites what a re-registration may change; id, name and
// created_at stay.
func (q *Q) UpdateProvider(id uuid.UUID, schema, contentType string, userID, workerID uuid.UUID) (Provider, error) {
	var ps []Provider
	err := q.g.Raw("UPDATE providers SET schema = ?, content_type = ?, user_id = ?, worker_id = ? WHERE id = ? RETURNING "+providerColsBare,
		schema, contentType, userID, workerID, id).Scan(&ps).Error
	if err != nil {
		return Provider{}, fmt.Errorf("update provider: %w", mapErr(err))
	}
	if len(ps) == 0 {
		return Provider{}, ErrNotFound
	}
	return ps[0], nil
}

// DeleteProvider removes a provider and returns it (ErrNotFound if it was
// already gone).
func (q *Q) DeleteProvider(id uuid.UUID) (Provider, error) {
	var ps []Provider
	if err := q.g.Raw("DELETE FROM providers WHERE id = ? RETURNING "+providerColsBare, id).Scan(&ps).Error; err != nil {
		return Provider{}, fmt.Errorf("delete provider: %w", mapErr(err))
	}
	if len(ps) == 0 {
		return Provider{}, ErrNotFound
	}
	return ps[0], nil
}

// ListProviders pages through the providers of the given rooms, newest first.
func (q *Q) ListProviders(rooms []string, p Page) ([]Provider, int64, error) {
	var total int64
	if err := q.g.Raw("SELECT count(*) FROM providers p WHERE p.room_id IN ?", rooms).Scan(&total).Error; err != nil {
		return nil, 0, fmt.Errorf("count providers: %w", mapErr(err))
	}
	ps := []Provider{}
	if p.Limit > 0 {
		err := q.g.Raw("SELECT "+providerCols+" FROM providers p WHERE p.room_id IN ? ORDER BY p.created_at DESC, p.seq DESC LIMIT ? OFFSET ?",
			rooms, p.Limit, p.Offset).Scan(&ps).Error
		if err != nil {
			return nil, 0, fmt.Errorf("list providers: %w", mapErr(err))
		}
	}
	return ps, total, nil
}
