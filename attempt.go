package idemkv

import (
	"crypto/rand"
	"encoding/hex"
)

// AttemptIDPrefix starts every attempt id idemkv makes up, so that one in a log or a
// record reads as an attempt id. The Python and TypeScript clients make the same shape.
const AttemptIDPrefix = "att_"

// NewAttemptID returns a fresh random attempt id: the prefix and 96 random bits in hex.
// The client sends one per attempt so that a reserve retried after a lost answer is
// recognised as the same attempt (docs/protocol.md, section 2, Errors), and the node
// makes one up when a caller sends none; both use this one generator.
func NewAttemptID() string {
	var b [12]byte
	// crypto/rand.Read never returns an error (Go 1.24+: it crashes the program instead).
	_, _ = rand.Read(b[:])
	return AttemptIDPrefix + hex.EncodeToString(b[:])
}
