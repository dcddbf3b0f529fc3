package telemetry

import (
	"net/http"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkv/idemkv/internal/httpx"
)

// ScopeName is the instrumentation scope of idemkv's server spans.
const ScopeName = "github.com/idemkv/idemkv/telemetry"

// OpenTelemetry's own global tracer provider and propagator, before anything replaces
// them: while both are still in place nothing records a span and no trace crosses the
// wire (the default propagator extracts nothing), so a request needs no span at all.
var (
	defaultTracerProvider = otel.GetTracerProvider()
	defaultPropagator     = otel.GetTextMapPropagator()
)

// untraced reports whether tracing was never set up (Setup, or a test's own provider
// or propagator). Comparing with the defaults cannot panic: their dynamic types are
// pointers, and interfaces of different dynamic types compare unequal.
func untraced() bool {
	return otel.GetTracerProvider() == defaultTracerProvider && otel.GetTextMapPropagator() == defaultPropagator
}

// HTTPMiddleware starts a server span per request, as a child of the W3C traceparent
// the caller sent, and names it after the route pattern ("POST /v1/reserve"), never the
// raw path, so that span names do not carry tenants or keys.
//
// It uses the global tracer provider and propagator as they are when each request
// arrives, so it may be installed before Setup runs.
//
// Health probes (/healthz, /readyz) get no span: a load balancer probing every second
// would otherwise fill the trace store with them. Nor does any request while tracing
// was never set up (untraced): extracting nothing and starting a span that records
// nothing cost a replay 2-3% of its CPU.
func HTTPMiddleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" || untraced() {
			next.ServeHTTP(w, r)
			return
		}
		ctx := otel.GetTextMapPropagator().Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := otel.Tracer(ScopeName).Start(ctx, r.Method,
			trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(
				attribute.String("http.request.method", r.Method),
				attribute.String("url.path", r.URL.Path),
				attribute.String("server.address", r.Host),
			))
		defer span.End()
		if !span.IsRecording() && !span.SpanContext().IsValid() {
			// No tracer records it and the caller sent no trace to carry on (to a
			// leader a follower forwards to): nothing to name, annotate or pass on.
			next.ServeHTTP(w, r)
			return
		}

		sw := &httpx.StatusWriter{ResponseWriter: w}
		// The mux records the matched pattern on the request it serves, which is
		// this one: read it back once the handler is done.
		req := r.WithContext(ctx)
		next.ServeHTTP(sw, req)

		status := sw.Status()
		if req.Pattern != "" {
			route := req.Pattern
			if i := strings.IndexByte(route, ' '); i >= 0 {
				route = route[i+1:]
			}
			span.SetName(r.Method + " " + route)
			span.SetAttributes(attribute.String("http.route", route))
		}
		span.SetAttributes(attribute.Int("http.response.status_code", status))
		if status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(status))
		}
	})
}
