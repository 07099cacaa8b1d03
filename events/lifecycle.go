package events

import "github.com/zndraw/joblib/internal/startstop"

// The buses that run goroutines follow the one start/stop contract.
var (
	_ startstop.Service = (*PGBus)(nil)
	_ startstop.Service = (*NATSBus)(nil)
)
