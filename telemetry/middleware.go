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

// OpenTelemetry's own global tracer provider, before anything replaces it: while it is
// still in place no span records.
var defaultTracerProvider = otel.GetTracerProvider()

// untraced reports whether a request with headers h needs no span: no tracer provider
// was set up (Setup installs one only when an exporter is configured, so a plain
// `idemkv serve` has none), so no span would record, and h carries none of the
// propagator's headers, so there is no trace to carry on to a leader this node forwards
// to. The span would be neither recording nor valid, which the middleware passes over
// anyway; skipping it saves extracting nothing and starting a span on every request.
// Comparing with the default provider cannot panic: its dynamic type is a pointer, and
// interfaces of different dynamic types compare unequal.
func untraced(h http.Header) bool {
	if otel.GetTracerProvider() != defaultTracerProvider {
		return false
	}
	p := otel.GetTextMapPropagator()
	var fields []string
	if own, ok := p.(*propagator); ok {
		fields = own.fields
	} else {
		fields = p.Fields()
	}
	for name := range h {
		for _, f := range fields {
			if strings.EqualFold(name, f) {
				return false
			}
		}
	}
	return true
}

// propagator is the propagator Setup installs, with the names of the headers it reads
// listed once, not on every request (untraced).
type propagator struct {
	propagation.TextMapPropagator
	fields []string
}

func newPropagator(p propagation.TextMapPropagator) *propagator {
	return &propagator{TextMapPropagator: p, fields: p.Fields()}
}

// HTTPMiddleware starts a server span per request, as a child of the W3C traceparent
// the caller sent, and names it after the route pattern ("POST /v1/reserve"), never the
// raw path, so that span names do not carry tenants or keys.
//
// It uses the global tracer provider and propagator as they are when each request
// arrives, so it may be installed before Setup runs.
//
// Health probes (/healthz, /readyz) get no span: a load balancer probing every second
// would otherwise fill the trace store with them. Nor does a request that no span of
// this node would record and that carries no trace (untraced): extracting nothing and
// starting a span that records nothing cost a replay 2-3% of its CPU.
func HTTPMiddleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" || untraced(r.Header) {
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
