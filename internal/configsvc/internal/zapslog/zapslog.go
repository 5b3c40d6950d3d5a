// Package zapslog bridges etcd's zap logging into log/slog: a zapcore.Core
// that forwards every enabled entry to an injected *slog.Logger, so etcd's
// client and embedded server log through the same handler as the rest of
// WheelFS.
package zapslog

import (
	"context"
	"log/slog"
	"maps"
	"slices"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New returns a zap logger whose entries at or above min go to l. A nil l
// discards everything.
func New(l *slog.Logger, min zapcore.Level) *zap.Logger {
	if l == nil {
		return zap.NewNop()
	}
	return zap.New(&core{l: l, min: min})
}

type core struct {
	l     *slog.Logger
	min   zapcore.Level
	attrs []slog.Attr // accumulated by With
}

func toSlog(lvl zapcore.Level) slog.Level {
	switch {
	case lvl <= zapcore.DebugLevel:
		return slog.LevelDebug
	case lvl == zapcore.InfoLevel:
		return slog.LevelInfo
	case lvl == zapcore.WarnLevel:
		return slog.LevelWarn
	case lvl == zapcore.ErrorLevel:
		return slog.LevelError
	default: // DPanic, Panic, Fatal
		return slog.LevelError + 4
	}
}

func (c *core) Enabled(lvl zapcore.Level) bool {
	return lvl >= c.min && c.l.Enabled(context.Background(), toSlog(lvl))
}

func (c *core) With(fields []zapcore.Field) zapcore.Core {
	if len(fields) == 0 {
		return c
	}
	n := &core{l: c.l, min: c.min}
	n.attrs = append(slices.Clip(c.attrs), fieldsToAttrs(fields)...)
	return n
}

func (c *core) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *core) Write(e zapcore.Entry, fields []zapcore.Field) error {
	r := slog.NewRecord(e.Time, toSlog(e.Level), e.Message, 0)
	if e.LoggerName != "" {
		r.AddAttrs(slog.String("logger", e.LoggerName))
	}
	r.AddAttrs(c.attrs...)
	r.AddAttrs(fieldsToAttrs(fields)...)
	return c.l.Handler().Handle(context.Background(), r)
}

func (c *core) Sync() error { return nil }

// fieldsToAttrs converts zap fields through zap's own map encoder, so every
// field type (errors, durations, arrays, objects) is rendered correctly.
func fieldsToAttrs(fields []zapcore.Field) []slog.Attr {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	attrs := make([]slog.Attr, 0, len(enc.Fields))
	for _, k := range slices.Sorted(maps.Keys(enc.Fields)) {
		attrs = append(attrs, slog.Any(k, enc.Fields[k]))
	}
	return attrs
}
