package joblib

import (
	"strings"
)

// Special rooms.
const (
	RoomGlobal   = "@global"
	RoomInternal = "@internal"
)

// maxRoomIDLen bounds room ids; longer ones are rejected as invalid.
const maxRoomIDLen = 256

// ValidateRoomID accepts @global, @internal and any non-empty id without '@'
// or ':'.
func ValidateRoomID(room string) error {
	if room == RoomGlobal || room == RoomInternal {
		return nil
	}
	if room == "" || strings.ContainsAny(room, "@:") || len(room) > maxRoomIDLen || strings.ContainsFunc(room, isControl) {
		return errf(CodeInvalidRoomID, "Room ID '%s' contains invalid characters (@ or :)", room)
	}
	return nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

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
