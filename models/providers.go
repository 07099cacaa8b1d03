package models

import (
	"fmt"
)

const providerCols = "p.id, p.seq, p.room_id, p.category, p.name, p.schema, p.content_type, p.user_id, p.worker_id, p.created_at"

// ProviderByKey finds a provider by (room, category, name).
func (q *Q) ProviderByKey(room, category, name string) (Provider, error) {
	var ps []Provider
	err := q.g.Raw("SELECT "+providerCols+" FROM providers p WHERE p.room_id = ? AND p.category = ? AND p.name = ?", room, category, name).Scan(&ps).Error
	if err != nil {
		return Provider{}, fmt.Errorf("read provider: %w", mapErr(err))
	}
	if len(ps) == 0 {
		return Provider{}, ErrNotFound
	}
	return ps[0], nil
}
