// Package server is the transport: REST handlers with problem details,
// authentication, the Socket.IO endpoint, metrics and health.
package server
