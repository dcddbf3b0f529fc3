package node

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"sort"
	"time"

	"github.com/hashicorp/go-hclog"
)

// newHCLogger gives hashicorp/raft (which logs through hclog) a logger whose lines
// become slog records at their own level, with their key-value pairs as attributes.
// Raft's WARN and ERROR lines used to arrive as INFO records with the level inside the
// message, so a log pipeline alerting on level missed them.
//
// hclog writes one JSON object per line; the writer decodes it and hands slog a record.
// Only levels slog would keep are formatted at all: hclog's level follows slog's.
func newHCLogger(l *slog.Logger) hclog.Logger {
	level := hclog.Info
	if l.Enabled(context.Background(), slog.LevelDebug) {
		level = hclog.Debug
	}
	return hclog.New(&hclog.LoggerOptions{
		Name:       "raft",
		Level:      level,
		JSONFormat: true,
		Output:     &hclogWriter{l: l.With("component", "raft")},
	})
}

// hclogWriter turns hclog's JSON lines into slog records.
type hclogWriter struct{ l *slog.Logger }

// hclog's own keys in a JSON line.
const (
	hcLevel     = "@level"
	hcMessage   = "@message"
	hcModule    = "@module"
	hcTimestamp = "@timestamp"
	hcCaller    = "@caller"
)

func (w *hclogWriter) Write(p []byte) (int, error) {
	for _, line := range bytes.Split(bytes.TrimSpace(p), []byte("\n")) {
		w.record(line)
	}
	return len(p), nil
}

func (w *hclogWriter) record(line []byte) {
	var fields map[string]any
	if err := json.Unmarshal(line, &fields); err != nil {
		// Not hclog's JSON (it always is): keep the text rather than lose it.
		w.l.Warn(string(line))
		return
	}
	msg, _ := fields[hcMessage].(string)
	lvl, _ := fields[hcLevel].(string)
	keys := make([]string, 0, len(fields))
	for k := range fields {
		switch k {
		case hcLevel, hcMessage, hcTimestamp, hcCaller:
		default:
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	level := slogLevel(lvl)
	if !w.l.Enabled(context.Background(), level) {
		return
	}
	r := slog.NewRecord(time.Now(), level, msg, 0)
	for _, k := range keys {
		name := k
		if k == hcModule {
			name = "module"
		}
		r.AddAttrs(slog.Any(name, fields[k]))
	}
	_ = w.l.Handler().Handle(context.Background(), r)
}

// slogLevel maps hclog's level names to slog's; trace is below debug.
func slogLevel(name string) slog.Level {
	switch name {
	case "trace":
		return slog.LevelDebug - 4
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}
