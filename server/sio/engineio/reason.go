package engineio

import "github.com/coder/websocket"

// Close reasons given to Handler.OnClose by the Engine.IO layer. Conn.Close
// and Conn.CloseWith pass their reason through unchanged.
const (
	// ReasonTransportClose: the client closed the websocket or sent a close packet.
	ReasonTransportClose = "transport close"
	// ReasonTransportError: a write failed or got stuck, or polling requests overlapped.
	ReasonTransportError = "transport error"
	// ReasonPingTimeout: no pong within PingTimeout.
	ReasonPingTimeout = "ping timeout"
	// ReasonSlowConsumer: the session's send queue overflowed.
	ReasonSlowConsumer = "slow consumer"
	// ReasonServerShutdown: Server.Shutdown.
	ReasonServerShutdown = "server shutting down"
	// ReasonParseError: the client sent an invalid or out-of-place packet.
	ReasonParseError = "parse error"
	// ReasonPayloadTooLarge: a message or POST body exceeded Config.MaxPayload.
	ReasonPayloadTooLarge = "payload too large"
)

// Websocket close codes of the Engine.IO reasons. Application codes are in
// the 4000–4999 range.
const (
	CloseCodeGeneric        websocket.StatusCode = 4000 // any other reason
	CloseCodePingTimeout    websocket.StatusCode = 4001
	CloseCodeParseError     websocket.StatusCode = 4002
	CloseCodeTransportError websocket.StatusCode = 4004
	CloseCodeSlowConsumer   websocket.StatusCode = 4008
)

// CloseCode returns the websocket close code sent with an Engine.IO reason
// (CloseCodeGeneric for any other reason).
func CloseCode(reason string) websocket.StatusCode {
	switch reason {
	case ReasonTransportClose:
		return websocket.StatusNormalClosure
	case ReasonServerShutdown:
		return websocket.StatusGoingAway
	case ReasonPayloadTooLarge:
		return websocket.StatusMessageTooBig
	case ReasonPingTimeout:
		return CloseCodePingTimeout
	case ReasonParseError:
		return CloseCodeParseError
	case ReasonTransportError:
		return CloseCodeTransportError
	case ReasonSlowConsumer:
		return CloseCodeSlowConsumer
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
