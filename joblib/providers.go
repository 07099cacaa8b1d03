package joblib

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/zndraw/joblib/events"
	"github.com/zndraw/joblib/internal/canonical"
	"github.com/zndraw/joblib/internal/limits"
	"github.com/zndraw/joblib/models"
)

// DefaultContentType is a provider's media type when registration names none.
const DefaultContentType = "application/json"

// RegisterProviderParams is the body of PUT /rooms/{room}/providers.
type RegisterProviderParams struct {
	Category    string
	Name        string
	Schema      json.RawMessage // nil means {}
	ContentType string          // empty means application/json
	WorkerID    *uuid.UUID      // nil: a new worker is created for the caller
}

// RegisterProvider registers a provider in a room, or updates the caller's
// (or, for a superuser, anyone's) existing one. created is true for a new row.
// Registering in @global or @internal takes a superuser (the contract checked
// only @global). An update drops the provider's cached results: the new
// registration may serve different data or a different content type.
func (s *Service) RegisterProvider(ctx context.Context, p Principal, room string, r RegisterProviderParams) (prov Provider, created bool, err error) {
	if err := ValidateRoomID(room); err != nil {
		return Provider{}, false, err
	}
	if (room == RoomGlobal || room == RoomInternal) && !p.Superuser {
		return Provider{}, false, errf(CodeForbidden, "Admin required for %s provider registration", room)
	}
	if err := validateText("category", r.Category, maxCategoryLen); err != nil {
		return Provider{}, false, err
	}
	if err := validateText("name", r.Name, maxNameLen); err != nil {
		return Provider{}, false, err
	}
	if err := validateText("content_type", r.ContentType, maxCategoryLen); err != nil {
		return Provider{}, false, err
	}
	if err := validateAddressable("provider", room, r.Category, r.Name, "info"); err != nil {
		return Provider{}, false, err
	}
	st := s.Settings()
	if len(st.AllowedProviderCategories) > 0 && !st.AllowedProviderCategories.Contains(r.Category) {
		return Provider{}, false, errf(CodeInvalidCategory, "Provider category '%s' not in allowed list: %s", r.Category, st.AllowedProviderCategories.pyList())
	}
	schema, err := canonicalObject(r.Schema)
	if err != nil {
		return Provider{}, false, err
	}
	contentType := r.ContentType
	if contentType == "" {
		contentType = DefaultContentType
	}
	err = s.mutate(ctx, func(q *models.Q, em *events.Set) error {
		if r.WorkerID == nil {
			if err := s.checkQuota(q, p, models.UsageWorkers, false); err != nil {
				return err
			}
		}
		w, err := workerFor(q, p, r.WorkerID)
		if err != nil {
			return err
		}
		row := models.Provider{ID: uuid.New(), RoomID: room, Category: r.Category, Name: r.Name, Schema: schema,
			ContentType: contentType, UserID: p.ID, WorkerID: w.ID}
		inserted, err := q.InsertProviderIfAbsent(row)
		if err != nil {
			if errors.Is(err, models.ErrConflict) {
				// The worker was cleaned up between our read and the insert.
				return errf(CodeWorkerNotFound, "Worker '%s' not found or not owned by user", w.ID)
			}
			return err
		}
		if inserted {
			if err := s.checkQuota(q, p, models.UsageProviders, true); err != nil {
				return err
			}
		}
		cur, err := q.ProviderByKey(room, r.Category, r.Name, true)
		if err != nil {
			return err
		}
		if !inserted {
			if cur.UserID != p.ID && !p.Superuser {
				return errf(CodeForbidden, "Provider already registered by another user")
			}
			if cur, err = q.UpdateProvider(cur.ID, schema, contentType, p.ID, w.ID); err != nil {
				if errors.Is(err, models.ErrConflict) {
					return errf(CodeWorkerNotFound, "Worker '%s' not found or not owned by user", w.ID)
				}
				return err
			}
		}
		created = inserted
		prov = providerView(cur)
		em.Add(events.Room(room), events.ProvidersInvalidate{})
		return nil
	})
	if err != nil {
		return Provider{}, false, err
	}
	if !created {
		s.purgeProvider(ctx, prov.ID)
	}
	return prov, created, nil
}

// purgeProvider drops a provider's cached results after its registration
// changed or ended. A failure only delays their expiry (they are keyed by
// provider id, so a new provider never sees them), hence it is logged.
func (s *Service) purgeProvider(ctx context.Context, id uuid.UUID) {
	if err := s.cache.PurgeProvider(context.WithoutCancel(ctx), id); err != nil {
		s.log.Error("purge provider results", "provider_id", id, "err", err)
	}
}

// ListProviders pages through the providers visible from a room, newest
// first: a room sees its own and the @global ones, @global only its own.
func (s *Service) ListProviders(ctx context.Context, room string, pg PageParams) (Page[Provider], error) {
	if err := ValidateRoomID(room); err != nil {
		return Page[Provider]{}, err
	}
	ps, total, err := s.db.Q(ctx).ListProviders(providerRoomsVisibleFrom(room), pg)
	if err != nil {
		return Page[Provider]{}, err
	}
	items := make([]Provider, len(ps))
	for i, p := range ps {
		items[i] = providerView(p)
	}
	return Page[Provider]{Items: items, Total: total, Limit: pg.Limit, Offset: pg.Offset}, nil
}

// ProviderInfo resolves a provider by full name as seen from a room.
func (s *Service) ProviderInfo(ctx context.Context, room, fullName string) (Provider, error) {
	if err := ValidateRoomID(room); err != nil {
		return Provider{}, err
	}
	p, err := resolveProvider(s.db.Q(ctx), room, fullName)
	if err != nil {
		return Provider{}, err
	}
	return providerView(p), nil
}

// resolveProvider applies contract §7.2: a room reaches its own and the
// @global providers; a request through @global reaches any room's.
func resolveProvider(q *models.Q, room, fullName string) (models.Provider, error) {
	pRoom, cat, name, ok := SplitFullName(fullName)
	if !ok {
		return models.Provider{}, errf(CodeProviderNotFound, "Invalid provider name format: %s", fullName)
	}
	if room != RoomGlobal && pRoom != RoomGlobal && pRoom != room {
		return models.Provider{}, errf(CodeProviderNotFound, "Provider '%s' not accessible from room '%s'", fullName, room)
	}
	if !addressable(pRoom, cat, name) {
		return models.Provider{}, errf(CodeProviderNotFound, "Provider '%s' not found", fullName)
	}
	p, err := q.ProviderByKey(pRoom, cat, name, false)
	if err != nil {
		return p, notFound(err, errf(CodeProviderNotFound, "Provider '%s' not found", fullName))
	}
	return p, nil
}

// DeleteProvider unregisters a provider (owner or superuser) and drops its
// cached results.
func (s *Service) DeleteProvider(ctx context.Context, p Principal, id uuid.UUID) error {
	gone := errf(CodeProviderNotFound, "Provider '%s' not found", id)
	err := s.mutate(ctx, func(q *models.Q, em *events.Set) error {
		cur, err := q.GetProvider(id)
		if err != nil {
			return notFound(err, gone)
		}
		if cur.UserID != p.ID && !p.Superuser {
			return errf(CodeForbidden, "Provider belongs to different user")
		}
		if _, err := q.DeleteProvider(id); err != nil {
			return notFound(err, gone)
		}
		if cur.UserID != p.ID {
			if err := audit(q, AuditProviderDelete, &id, "user:"+p.Name, map[string]any{"user_id": p.ID, "owner_id": cur.UserID, "provider": cur.FullName()}); err != nil {
				return err
			}
		}
		em.Add(events.Room(cur.RoomID), events.ProvidersInvalidate{})
		return nil
	})
	if err != nil {
		return err
	}
	s.purgeProvider(ctx, id)
	return nil
}

// ProviderRead is the answer to a provider read.
type ProviderRead struct {
	Body        []byte
	ContentType string
	// Waited is true when the caller asked for a wait (Prefer: wait=N);
	// Timeout is then the effective wait (the server answers
	// Preference-Applied with it).
	Waited  bool
	Timeout time.Duration
	// Cached is true when the result was in the cache at the first look.
	Cached bool
}

// ReadProvider serves a provider read (contract §7.3): a cached result at
// once; otherwise one provider_request per (provider, params) while its
// inflight lock is held, however many readers ask, and a wait — woken by the
// upload itself, on any node — of wait (capped by ProviderLongPollMax) or, when
// wait is nil, ProviderLongPollDefault. Nothing in time is a ProviderTimeout
// error. No database connection is held while waiting.
func (s *Service) ReadProvider(ctx context.Context, room, fullName string, params map[string]string, wait *time.Duration) (ProviderRead, error) {
	return s.ReadProviderAs(ctx, Principal{Superuser: true}, room, fullName, params, wait)
}

// ReadProviderAs is ReadProvider for the caller p: a read that would
// dispatch a provider_request spends a token of p's ProviderDispatchRate
// bucket (superusers are not limited); past it the read answers 429 and
// nothing is dispatched.
func (s *Service) ReadProviderAs(ctx context.Context, p Principal, room, fullName string, params map[string]string, wait *time.Duration) (ProviderRead, error) {
	if err := ValidateRoomID(room); err != nil {
		return ProviderRead{}, err
	}
	prov, err := resolveProvider(s.db.Q(ctx), room, fullName)
	if err != nil {
		return ProviderRead{}, err
	}
	st := s.Settings()
	out := ProviderRead{ContentType: prov.ContentType}
	out.Timeout = st.ProviderLongPollDefault
	if wait != nil {
		out.Waited = true
		out.Timeout = min(max(*wait, 0), st.ProviderLongPollMax)
	}
	canon := canonical.CanonicalParams(params)
	k := ResultKey{ProviderID: prov.ID, Hash: canonical.Hash(canon)}
	body, ok, err := s.cache.Get(ctx, k)
	if err != nil {
		return ProviderRead{}, err
	}
	if ok {
		out.Body, out.Cached, out.Waited = body, true, false
		return out, nil
	}
	if err := s.dispatchRead(ctx, p, prov, k, canon, st.ProviderInflightTTL); err != nil {
		return ProviderRead{}, err
	}
	body, ok, err = s.cache.Wait(ctx, k, out.Timeout)
	if err != nil {
		return ProviderRead{}, err
	}
	if !ok {
		return ProviderRead{}, errf(CodeProviderTimeout, "Provider '%s' did not respond within %ss", fullName, seconds(out.Timeout))
	}
	out.Body = body
	return out, nil
}

// dispatchRead sends provider_request to the provider's clients unless a
// dispatch for the same key is in flight. The result is re-checked after the
// lock is taken: an upload that landed between the first look and the lock
// (it stores before it releases) needs no dispatch.
func (s *Service) dispatchRead(ctx context.Context, p Principal, prov models.Provider, k ResultKey, canonical string, ttl time.Duration) error {
	acquired, err := s.cache.AcquireInflight(ctx, k, ttl)
	if err != nil || !acquired {
		return err
	}
	if _, ok, err := s.cache.Get(ctx, k); err != nil || ok {
		if ok {
			err = s.cache.ReleaseInflight(ctx, k)
		}
		return err
	}
	if err := allow(s.rates.dispatch, p, limits.ProviderDispatchRate, "provider reads that dispatch to a provider"); err != nil {
		if rerr := s.cache.ReleaseInflight(ctx, k); rerr != nil {
			return rerr
		}
		return err
	}
	full := prov.FullName()
	s.publish(ctx, []events.Emission{{
		Room:  events.ProviderRoom(full),
		Event: events.ProviderRequest{RequestID: k.Hash, ProviderName: full, Params: canonical},
	}})
	return nil
}

// seconds prints a duration in seconds the way the Python server printed its
// integer settings ("5"), with a fraction only when there is one.
func seconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64)
}

// ValidRequestHash reports whether h looks like a request hash (lowercase hex SHA-256).
func ValidRequestHash(h string) bool {
	if len(h) != 64 {
		return false
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// UploadProviderResult stores a provider's answer to a read (owner or
// superuser), releases the inflight lock, wakes the readers on every node
// and tells the provider's room. body is read up to
// ProviderMaxResultBytes; more is a PayloadTooLarge error and stores nothing.
//
// The checks run in the order the Python server answers them: the provider
// is found (404), then its owner checked (403), and only then is the hash's
// shape validated (422), so a client learns first that its provider is gone.
func (s *Service) UploadProviderResult(ctx context.Context, p Principal, id uuid.UUID, hash string, body io.Reader) error {
	prov, err := s.db.Q(ctx).GetProvider(id)
	if err != nil {
		return notFound(err, errf(CodeProviderNotFound, "Provider '%s' not found", id))
	}
	if prov.UserID != p.ID && !p.Superuser {
		return errf(CodeForbidden, "Not authorized to upload results for this provider")
	}
	if !ValidRequestHash(hash) {
		return errf(CodeValidation, "X-Request-Hash must be the request's SHA-256 as 64 lowercase hex digits")
	}
	st := s.Settings()
	data, err := io.ReadAll(io.LimitReader(body, st.ProviderMaxResultBytes+1))
	if err != nil {
		return errf(CodeValidation, "could not read the result body: %v", err)
	}
	if int64(len(data)) > st.ProviderMaxResultBytes {
		return limitErr(CodePayloadTooLarge, limits.ProviderResultBytes, 0, "provider result exceeds %d bytes", st.ProviderMaxResultBytes)
	}
	k := ResultKey{ProviderID: prov.ID, Hash: hash}
	// Store before release: a reader that takes the lock after the release
	// finds the result on its re-check and does not dispatch again.
	if err := s.cache.Store(ctx, k, data, st.ProviderResultTTL); err != nil {
		return err
	}
	if err := s.cache.ReleaseInflight(ctx, k); err != nil {
		return err
	}
	if err := s.cache.Notify(ctx, k); err != nil {
		// The result is stored; readers elsewhere find it at their deadline.
		s.log.Error("notify provider result", "provider", prov.FullName(), "err", err)
	}
	full := prov.FullName()
	s.publish(ctx, []events.Emission{{
		Room:  events.Room(prov.RoomID),
		Event: events.ProviderResultReady{ProviderName: full, RequestHash: hash},
	}})
	return nil
}
