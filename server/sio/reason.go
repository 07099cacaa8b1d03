package sio

import (
	"errors"

	"github.com/coder/websocket"
	"github.com/zndraw/joblib/server/sio/engineio"
)

// Reasons passed to Handler.OnDisconnect. Socket.Close passes its own reason
// through unchanged.
const (
	// ReasonTransportClose: the client closed the websocket or sent an Engine.IO
	// close packet. The client reconnects.
	ReasonTransportClose = engineio.ReasonTransportClose
	// ReasonTransportError: a write failed or got stuck, or polling requests
	// overlapped. The client reconnects.
	ReasonTransportError = engineio.ReasonTransportError
	// ReasonPingTimeout: no pong within PingTimeout. The client (if alive) reconnects.
	ReasonPingTimeout = engineio.ReasonPingTimeout
	// ReasonClientNamespaceDisconnect: the client sent DISCONNECT for the
	// namespace (socket.disconnect()). Terminal: the client does not reconnect
	// by itself.
	ReasonClientNamespaceDisconnect = "client namespace disconnect"
	// ReasonServerNamespaceDisconnect: Socket.Disconnect. Terminal: the JS client
	// reports "io server disconnect" and does not reconnect.
	ReasonServerNamespaceDisconnect = "server namespace disconnect"
	// ReasonSlowConsumer: the session's send queue overflowed. The client reconnects.
	ReasonSlowConsumer = engineio.ReasonSlowConsumer
	// ReasonServerShutdown: Server.Shutdown. The client reconnects (elsewhere).
	ReasonServerShutdown = engineio.ReasonServerShutdown
	// ReasonParseError: the client sent an invalid or out-of-place packet.
	ReasonParseError = engineio.ReasonParseError
	// ReasonPayloadTooLarge: a message or POST body exceeded Config.MaxPayload.
	ReasonPayloadTooLarge = engineio.ReasonPayloadTooLarge
	// ReasonEventQueueFull: more than Config.SendQueue events waited for OnEvent.
	ReasonEventQueueFull = "event queue full"
	// ReasonTooManyAttachments: a packet announced more than
	// Config.MaxAttachments attachments.
	ReasonTooManyAttachments = "too many attachments"
	// ReasonEventTooLarge: a packet with its attachments exceeded
	// Config.MaxEventBytes.
	ReasonEventTooLarge = "event too large"
	// ReasonTooDeep: an event's arguments nest deeper than Config.MaxDepth.
	ReasonTooDeep = "nesting too deep"
	// reasonConnectTimeout never reaches OnDisconnect: no socket exists yet.
	reasonConnectTimeout = "connect timeout"
)

// Websocket close codes sent with each reason (the reason text is the frame's
// reason). Application codes are in the 4000–4999 range.
const (
	CloseCodeGeneric                             = engineio.CloseCodeGeneric // Socket.Close with a custom reason
	CloseCodePingTimeout                         = engineio.CloseCodePingTimeout
	CloseCodeParseError                          = engineio.CloseCodeParseError
	CloseCodeConnectTimeout websocket.StatusCode = 4003
	CloseCodeTransportError                      = engineio.CloseCodeTransportError
	CloseCodeSlowConsumer                        = engineio.CloseCodeSlowConsumer
	CloseCodeEventQueueFull websocket.StatusCode = 4009
	CloseCodeLimit          websocket.StatusCode = 4010 // too many attachments, event too large, nesting too deep
)

func closeCode(reason string) websocket.StatusCode {
	switch reason {
	case ReasonClientNamespaceDisconnect, ReasonServerNamespaceDisconnect:
		return websocket.StatusNormalClosure
	case reasonConnectTimeout:
		return CloseCodeConnectTimeout
	case ReasonEventQueueFull:
		return CloseCodeEventQueueFull
	case ReasonTooManyAttachments, ReasonEventTooLarge, ReasonTooDeep:
		return CloseCodeLimit
	}
	return engineio.CloseCode(reason)
}

// Errors returned by Socket and Server methods.
var (
	// ErrClosed: the socket (or the server) is gone.
	ErrClosed = errors.New("sio: socket closed")
	// ErrSlowConsumer: the send queue was full; the connection is being closed.
	ErrSlowConsumer = errors.New("sio: send queue full")
	// ErrReservedEvent: the event name is reserved by the clients (connect,
	// connect_error, disconnect, disconnecting, newListener, removeListener).
	ErrReservedEvent = errors.New("sio: reserved event name")
	// ErrAckSent: an AckFunc was called a second time.
	ErrAckSent = errors.New("sio: ack already sent")
	// ErrTooManyRooms: Socket.Join past Config.MaxRooms.
	ErrTooManyRooms = errors.New("sio: too many rooms for this socket")
)
