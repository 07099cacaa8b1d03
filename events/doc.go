// Package events is the typed catalogue of the realtime events clients receive
// (wire names, payloads and room names), the de-duplicating Set a transaction
// collects them in, and the Bus that delivers committed emissions.
package events
