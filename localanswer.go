package idemkv

import "context"

// localAnswerKey carries the flag a store sets when it answered a reserve from its own
// applied state (docs/protocol.md "Followers").
type localAnswerKey struct{}

// NotingLocalAnswer returns a context under which a store that answers a reserve from
// its own applied state, without the log or a read index, says so in *answered. The
// API asks the leader's store once and marks such answers as a follower's local
// answers are marked, rather than ask it twice, first locally and then the leader's
// way.
func NotingLocalAnswer(ctx context.Context, answered *bool) context.Context {
	return context.WithValue(ctx, localAnswerKey{}, answered)
}

// NoteLocalAnswer records in ctx, if its caller asked (NotingLocalAnswer), that the
// answer came from the store's own applied state.
func NoteLocalAnswer(ctx context.Context) {
	if p, ok := ctx.Value(localAnswerKey{}).(*bool); ok {
		*p = true
	}
}
