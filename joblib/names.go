package joblib

import (
	"strings"
	"unicode/utf8"
)

// Special rooms.
const (
	RoomGlobal   = "@global"
	RoomInternal = "@internal"
)

// maxRoomIDLen bounds room ids; longer ones are rejected as invalid.
const maxRoomIDLen = 256

// Limits on the parts of a job's full name. Together with maxRoomIDLen they
// keep (room, category, name) inside what PostgreSQL's unique index can hold
// (about 2.7 kB per entry); longer names are refused rather than failing there.
const (
	maxCategoryLen = 256
	maxNameLen     = 1024
)

// ValidateRoomID accepts @global, @internal and any non-empty id without '@'
// or ':' (nor control characters or invalid UTF-8, which no database column
// can hold on both dialects).
func ValidateRoomID(room string) error {
	if room == RoomGlobal || room == RoomInternal {
		return nil
	}
	if room == "" || strings.ContainsAny(room, "@:") || len(room) > maxRoomIDLen || strings.ContainsFunc(room, isControl) || !utf8.ValidString(room) {
		return errf(CodeInvalidRoomID, "Room ID '%s' contains invalid characters (@ or :)", room)
	}
	return nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// storable reports whether s can be stored as text on both dialects:
// PostgreSQL rejects NUL characters and invalid UTF-8.
func storable(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// validateText checks a client-supplied string that is stored as text.
func validateText(field, s string, maxLen int) error {
	if !storable(s) {
		return errf(CodeValidation, "%s must be valid UTF-8 without NUL characters", field)
	}
	if maxLen > 0 && len(s) > maxLen {
		return errf(CodeValidation, "%s must be at most %d bytes long", field, maxLen)
	}
	return nil
}

// addressable reports whether a job with these parts could have been
// registered; names that could not are simply not found.
func addressable(room, category, name string) bool {
	return len(room) <= maxRoomIDLen && len(category) <= maxCategoryLen && len(name) <= maxNameLen &&
		storable(room) && storable(category) && storable(name)
}

// SplitFullName splits room:category:name on the first two colons (the name
// may contain more).
func SplitFullName(full string) (room, category, name string, ok bool) {
	parts := strings.SplitN(full, ":", 3)
	if len(parts) != 3 {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

// jobRoomsVisibleFrom lists the rooms whose jobs a room's listings show.
func jobRoomsVisibleFrom(room string) []string {
	switch room {
	case RoomGlobal, RoomInternal:
		return []string{room}
	}
	return []string{room, RoomGlobal, RoomInternal}
}

// providerRoomsVisibleFrom lists the rooms whose providers a room's listings show.
func providerRoomsVisibleFrom(room string) []string {
	if room == RoomGlobal {
		return []string{RoomGlobal}
	}
	return []string{room, RoomGlobal}
}

// validateAddressable refuses a job or provider whose full name could be
// registered but never fetched: the REST routes take a trailing "/tasks"
// (jobs) or "/info" (providers) for a sub-resource, an HTTP router cleans
// empty, "." and ".." path segments away, and a ':' in the category would
// move the split between category and name.
func validateAddressable(kind, room, category, name, subResource string) error {
	if strings.Contains(category, ":") {
		return errf(CodeValidation, "%s category must not contain ':'", kind)
	}
	full := room + ":" + category + ":" + name
	if strings.HasSuffix(full, "/"+subResource) {
		return errf(CodeValidation, "%s name must not end with '/%s' (that path is the %s's %s)", kind, subResource, kind, subResource)
	}
	for _, seg := range strings.Split(full, "/")[1:] {
		if seg == "" || seg == "." || seg == ".." {
			return errf(CodeValidation, "%s name must not contain empty, '.' or '..' path segments (it could not be addressed in a URL)", kind)
		}
	}
	return nil
}
