// Package benthoslog adapts a Benthos *service.Logger to slog.Handler, so
// libraries that log through slog (the embedded broker) write through the
// logger of the component that started them: the level and format set in the
// config's logger section apply to their lines too.
package benthoslog

import (
	"context"
	"log/slog"

	"github.com/redpanda-data/benthos/v4/public/service"
)

// Handler returns an slog.Handler writing to l. Level filtering is left to
// l, which applies the configured level.
func Handler(l *service.Logger) slog.Handler { return handler{log: l} }

type handler struct {
	log   *service.Logger
	group string // prefix of keys, "a.b." after WithGroup("a"), WithGroup("b")
}

func (h handler) Enabled(context.Context, slog.Level) bool { return true }

func (h handler) Handle(_ context.Context, r slog.Record) error {
	var kv []any
	r.Attrs(func(a slog.Attr) bool {
		kv = appendAttr(kv, h.group, a)
		return true
	})
	l := h.log
	if len(kv) > 0 {
		l = l.With(kv...)
	}
	switch {
	case r.Level >= slog.LevelError:
		l.Error(r.Message)
	case r.Level >= slog.LevelWarn:
		l.Warn(r.Message)
	case r.Level >= slog.LevelInfo:
		l.Info(r.Message)
	default:
		l.Debug(r.Message)
	}
	return nil
}

func (h handler) WithAttrs(as []slog.Attr) slog.Handler {
	var kv []any
	for _, a := range as {
		kv = appendAttr(kv, h.group, a)
	}
	if len(kv) == 0 {
		return h
	}
	return handler{log: h.log.With(kv...), group: h.group}
}

func (h handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return handler{log: h.log, group: h.group + name + "."}
}

// appendAttr flattens a (possibly group-valued) attribute into key/value
// pairs with dotted keys.
func appendAttr(kv []any, prefix string, a slog.Attr) []any {
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p += a.Key + "."
		}
		for _, g := range v.Group() {
			kv = appendAttr(kv, p, g)
		}
		return kv
	}
	if a.Key == "" {
		return kv
	}
	return append(kv, prefix+a.Key, v.Any())
}
