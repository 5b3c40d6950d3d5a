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
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New returns a zap logger whose entries at or above min go to l. Entries
// whose message is one of demote are logged at debug level instead (for
// known-benign warnings and errors). A nil l discards everything.
func New(l *slog.Logger, min zapcore.Level, demote ...string) *zap.Logger {
	z, _ := NewQuietable(l, min, demote...)
	return z
}

// NewQuietable is New plus a function that demotes every later entry to
// debug level: an embedded server logs errors about its own listeners
// closing while it is shut down on purpose.
func NewQuietable(l *slog.Logger, min zapcore.Level, demote ...string) (*zap.Logger, func()) {
	if l == nil {
		return zap.NewNop(), func() {}
	}
	c := &core{l: l, min: min, quiet: new(atomic.Bool)}
	if len(demote) > 0 {
		c.demote = make(map[string]bool, len(demote))
		for _, m := range demote {
			c.demote[m] = true
		}
	}
	return zap.New(c), func() { c.quiet.Store(true) }
}

type core struct {
	l      *slog.Logger
	min    zapcore.Level
	quiet  *atomic.Bool // shared by the cores that With derives
	demote map[string]bool
	attrs  []slog.Attr // accumulated by With
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

// Enabled reports whether entries at lvl may be logged; Check then decides
// per entry (demoted messages are only known there).
func (c *core) Enabled(lvl zapcore.Level) bool {
	return lvl >= c.min && c.l.Enabled(context.Background(), toSlog(lvl))
}

// level is the slog level an entry is logged at, and whether it is logged.
func (c *core) level(e zapcore.Entry) (slog.Level, bool) {
	lvl := toSlog(e.Level)
	if c.quiet.Load() || (c.demote[e.Message] && e.Level <= zapcore.ErrorLevel) {
		lvl = slog.LevelDebug
	} else if e.Level < c.min {
		return 0, false
	}
	return lvl, c.l.Enabled(context.Background(), lvl)
}

func (c *core) With(fields []zapcore.Field) zapcore.Core {
	if len(fields) == 0 {
		return c
	}
	n := &core{l: c.l, min: c.min, quiet: c.quiet, demote: c.demote}
	n.attrs = append(slices.Clip(c.attrs), fieldsToAttrs(fields)...)
	return n
}

func (c *core) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if _, ok := c.level(e); ok {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *core) Write(e zapcore.Entry, fields []zapcore.Field) error {
	lvl, ok := c.level(e)
	if !ok {
		return nil
	}
	r := slog.NewRecord(e.Time, lvl, e.Message, 0)
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
