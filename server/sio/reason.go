package sio

import (
	"errors"

	"github.com/coder/websocket"
)

// Reasons passed to Handler.OnDisconnect. Socket.Close passes its own reason
// through unchanged.
const (
	// ReasonTransportClose: the client closed the websocket or sent an Engine.IO
	// close packet. The client reconnects.
	ReasonTransportClose = "transport close"
	// ReasonTransportError: a write failed or timed out, or polling requests
	// overlapped. The client reconnects.
	ReasonTransportError = "transport error"
	// ReasonPingTimeout: no pong within PingTimeout. The client (if alive) reconnects.
	ReasonPingTimeout = "ping timeout"
	// ReasonClientNamespaceDisconnect: the client sent DISCONNECT for "/"
	// (socket.disconnect()). Terminal: the client does not reconnect by itself.
	ReasonClientNamespaceDisconnect = "client namespace disconnect"
	// ReasonServerNamespaceDisconnect: Socket.Disconnect. Terminal: the JS client
	// reports "io server disconnect" and does not reconnect.
	ReasonServerNamespaceDisconnect = "server namespace disconnect"
	// ReasonSlowConsumer: the connection's send queue overflowed. The client reconnects.
	ReasonSlowConsumer = "slow consumer"
	// ReasonServerShutdown: Server.Shutdown. The client reconnects (elsewhere).
	ReasonServerShutdown = "server shutting down"
	// ReasonParseError: the client sent an invalid or out-of-place packet.
	ReasonParseError = "parse error"
	// ReasonPayloadTooLarge: a message or POST body exceeded Config.MaxPayload.
	ReasonPayloadTooLarge = "payload too large"
	// ReasonEventQueueFull: more than Config.SendQueue events waited for OnEvent.
	ReasonEventQueueFull = "event queue full"
	// reasonConnectTimeout never reaches OnDisconnect: no socket exists yet.
	reasonConnectTimeout = "connect timeout"
)

// Websocket close codes sent with each reason (the reason text is the frame's
// reason). Application codes are in the 4000–4999 range.
const (
	CloseCodeGeneric        websocket.StatusCode = 4000 // Socket.Close with a custom reason
	CloseCodePingTimeout    websocket.StatusCode = 4001
	CloseCodeParseError     websocket.StatusCode = 4002
	CloseCodeConnectTimeout websocket.StatusCode = 4003
	CloseCodeTransportError websocket.StatusCode = 4004
	CloseCodeSlowConsumer   websocket.StatusCode = 4008
	CloseCodeEventQueueFull websocket.StatusCode = 4009
)

func closeCode(reason string) websocket.StatusCode {
	switch reason {
	case ReasonTransportClose, ReasonClientNamespaceDisconnect, ReasonServerNamespaceDisconnect:
		return websocket.StatusNormalClosure
	case ReasonServerShutdown:
		return websocket.StatusGoingAway
	case ReasonPayloadTooLarge:
		return websocket.StatusMessageTooBig
	case ReasonPingTimeout:
		return CloseCodePingTimeout
	case ReasonParseError:
		return CloseCodeParseError
	case reasonConnectTimeout:
		return CloseCodeConnectTimeout
	case ReasonTransportError:
		return CloseCodeTransportError
	case ReasonSlowConsumer:
		return CloseCodeSlowConsumer
	case ReasonEventQueueFull:
		return CloseCodeEventQueueFull
	}
	return CloseCodeGeneric
}

// closeText truncates a reason to fit a websocket close frame (123 bytes).
func closeText(reason string) string {
	if len(reason) > 123 {
		return reason[:123]
	}
	return reason
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
)

// errQueueFull is the sendQueue's internal overflow signal.
var errQueueFull = errors.New("send queue full")
