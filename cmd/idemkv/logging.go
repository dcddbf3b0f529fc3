package main

import (
	"log"
	"log/slog"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
)

// routeLibraryLogs sends what libraries log on their own through logger, so that
// --log-format json is JSON all of it and every line has a real level:
//   - the standard library's log package (slog.SetDefault redirects it), used by
//     libraries that know no better;
//   - OpenTelemetry's exporter and SDK errors (otherwise printed by the log package
//     without structure) and its internal logger.
//
// net/http servers take their logger per server: see httpErrorLog.
func routeLibraryLogs(logger *slog.Logger) {
	slog.SetDefault(logger)
	otelLog := logger.With("component", "otel")
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		otelLog.Warn("opentelemetry", "err", err)
	}))
	otel.SetLogger(logr.FromSlogHandler(otelLog.Handler()))
}

// httpErrorLog is an http.Server's ErrorLog: TLS handshake failures, accept errors
// and recovered handler panics become WARN records of the process's logger instead of
// bare lines on stderr.
func httpErrorLog(logger *slog.Logger) *log.Logger {
	return slog.NewLogLogger(logger.With("component", "http").Handler(), slog.LevelWarn)
}
