package engineio

import "net/http"

// ClientIP is the client address of a request, as the per-address session
// budget counts it. Other per-address budgets of the embedding server use it
// too, so that every budget agrees on who a client is.
func ClientIP(r *http.Request) string { return remoteIP(r) }
