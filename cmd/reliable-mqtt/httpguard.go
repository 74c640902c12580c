package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
)

// httpListenFailure is the start of the line Benthos logs when its HTTP
// server cannot listen (address in use, no such address, a privileged
// port). Benthos then runs on without /ready, /metrics and /ping.
const httpListenFailure = "HTTP Server error: listen "

// httpGuard stops the process when the HTTP server cannot listen: a second
// process started with the same http.address would otherwise run without
// its readiness probe and metrics, unnoticed until someone looks. It sees
// every log line through Benthos's tee logger and acts only on that one.
type httpGuard struct{ exit func(int) }

func (g httpGuard) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }

func (g httpGuard) Handle(_ context.Context, r slog.Record) error {
	if !strings.HasPrefix(r.Message, httpListenFailure) {
		return nil
	}
	fmt.Fprintf(os.Stderr, "%s: stopping: %s (every process on a host needs its own http.address, e.g. -s http.address=127.0.0.1:4196)\n",
		productName, strings.TrimSpace(strings.TrimPrefix(r.Message, "HTTP Server error: ")))
	g.exit(1)
	return nil
}

func (g httpGuard) WithAttrs([]slog.Attr) slog.Handler { return g }
func (g httpGuard) WithGroup(string) slog.Handler      { return g }
