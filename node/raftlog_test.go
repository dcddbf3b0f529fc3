package node

import (
	"context"
	"log/slog"
	"sync"
	"testing"
)

// recordingHandler keeps every record it is handed.
type recordingHandler struct {
	mu      sync.Mutex
	records []slog.Record
	attrs   []slog.Attr
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	r = r.Clone()
	r.AddAttrs(h.attrs...)
	h.records = append(h.records, r)
	return nil
}
func (h *recordingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &recordingView{h: h, attrs: as}
}
func (h *recordingHandler) WithGroup(string) slog.Handler { return h }

// recordingView is a recordingHandler with attributes added by With.
type recordingView struct {
	h     *recordingHandler
	attrs []slog.Attr
}

func (v *recordingView) Enabled(ctx context.Context, l slog.Level) bool { return v.h.Enabled(ctx, l) }

// WithAttrs keeps the level filter of l for the view it returns.
func (l levelHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return levelHandler{Handler: l.Handler.WithAttrs(as), min: l.min}
}
func (v *recordingView) Handle(ctx context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(v.attrs...)
	return v.h.Handle(ctx, r)
}
func (v *recordingView) WithAttrs(as []slog.Attr) slog.Handler {
	return &recordingView{h: v.h, attrs: append(append([]slog.Attr{}, v.attrs...), as...)}
}
func (v *recordingView) WithGroup(string) slog.Handler { return v }

// Raft's levels survive the trip through hclog: a WARN is a slog WARN with its
// key-value pairs as attributes, not an INFO carrying "[WARN]" in its text.
func TestRaftLogLevelsReachSlog(t *testing.T) {
	h := &recordingHandler{}
	hl := newHCLogger(slog.New(levelHandler{Handler: h, min: slog.LevelInfo}))
	hl.Warn("unable to get address for server", "id", "n2", "fallback", "n2:7421")
	hl.Error("failed to appendEntries", "peer", "n3")
	hl.Info("entering follower state")
	hl.Debug("not kept at info")

	want := []struct {
		level slog.Level
		msg   string
		key   string
		value string
	}{
		{slog.LevelWarn, "unable to get address for server", "id", "n2"},
		{slog.LevelError, "failed to appendEntries", "peer", "n3"},
		{slog.LevelInfo, "entering follower state", "module", "raft"},
	}
	if len(h.records) != len(want) {
		t.Fatalf("got %d records, want %d: %+v", len(h.records), len(want), h.records)
	}
	for i, w := range want {
		r := h.records[i]
		if r.Level != w.level || r.Message != w.msg {
			t.Errorf("record %d: %s %q, want %s %q", i, r.Level, r.Message, w.level, w.msg)
		}
		attrs := map[string]string{}
		r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
		if attrs[w.key] != w.value {
			t.Errorf("record %d: %s=%q, want %q (attrs %v)", i, w.key, attrs[w.key], w.value, attrs)
		}
		if attrs["component"] != "raft" {
			t.Errorf("record %d: component=%q, want raft", i, attrs["component"])
		}
	}
}

// With slog at debug, hclog's debug lines come through too, as debug.
func TestRaftLogFollowsSlogLevel(t *testing.T) {
	h := &recordingHandler{}
	l := slog.New(levelHandler{Handler: h, min: slog.LevelDebug})
	newHCLogger(l).Debug("a debug line")
	if len(h.records) != 1 || h.records[0].Level != slog.LevelDebug {
		t.Fatalf("records %+v", h.records)
	}
}

type levelHandler struct {
	slog.Handler
	min slog.Level
}

func (l levelHandler) Enabled(_ context.Context, lv slog.Level) bool { return lv >= l.min }
