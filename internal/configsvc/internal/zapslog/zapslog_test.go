package zapslog

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func TestBridge(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	z := New(l, zapcore.WarnLevel, "noisy").Named("etcd").With(zap.String("member", "m0"))

	z.Info("hidden info")
	z.Warn("noisy") // demoted to debug: below the handler's level
	z.Warn("disk slow", zap.Duration("took", 1500000000), zap.Error(errors.New("boom")), zap.Strings("peers", []string{"a", "b"}))
	z.Error("failed", zap.Int("n", 3))

	out := buf.String()
	for _, bad := range []string{"hidden info", "noisy"} {
		if strings.Contains(out, bad) {
			t.Errorf("%q logged:\n%s", bad, out)
		}
	}
	for _, want := range []string{
		`level=WARN msg="disk slow" logger=etcd member=m0`, `error=boom`, `took=1.5s`, `peers="[a b]"`,
		`level=ERROR msg=failed logger=etcd member=m0 n=3`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}

func TestNilLogger(t *testing.T) {
	New(nil, zapcore.DebugLevel).Error("nothing") // must not panic
}

func TestQuietDemotesErrors(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	z, quiet := NewQuietable(l, zapcore.WarnLevel)
	z.With(zap.String("k", "v")).Error("before")
	quiet()
	z.With(zap.String("k", "v")).Error("after") // demoted to debug: hidden
	if out := buf.String(); !strings.Contains(out, "before") || strings.Contains(out, "after") {
		t.Fatalf("log = %q", out)
	}
}
