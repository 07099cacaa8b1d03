package joblib

import "github.com/zndraw/joblib/internal/canonical"

// RequestHash is the identity of a provider read (contract §7.4): the
// lowercase hex SHA-256 of the canonical JSON of its parameters, the same
// bytes the Python server hashes. See package internal/canonical.
func RequestHash(params map[string]string) string { return canonical.RequestHash(params) }

// CanonicalParams is the canonical JSON of read parameters: the string sent
// as provider_request.params and hashed by RequestHash.
func CanonicalParams(params map[string]string) string { return canonical.CanonicalParams(params) }
