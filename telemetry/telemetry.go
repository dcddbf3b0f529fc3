// Package telemetry sets up OpenTelemetry tracing for the idemkv binary (docs/protocol.md section
// 6): a tracer provider configured by the standard OTEL_* environment variables, the
// W3C trace-context propagator, and a server span per API request.
//
// It imports the OpenTelemetry SDK and exporters, so only cmd/ and servers may import
// it; the client uses telemetry/semconv, which needs the API alone.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/telemetry/semconv"
)

// The attribute keys of docs/protocol.md section 6, for code that already imports telemetry.
const (
	ToolName        = semconv.ToolName
	ToolSideEffect  = semconv.ToolSideEffect
	IdempotencyKey  = semconv.IdempotencyKey
	Fingerprint     = semconv.Fingerprint
	Decision        = semconv.Decision
	ReceiptRemoteID = semconv.ReceiptRemoteID
	Tenant          = semconv.Tenant
	Fence           = semconv.Fence
)

// ErrConfig is wrapped by errors about OTEL_* variables this binary cannot honour.
var ErrConfig = errors.New("telemetry: unsupported configuration")

// Setup installs the global W3C propagator (trace context and baggage) and a global
// tracer provider built from the environment:
//
//   - OTEL_TRACES_EXPORTER: a comma-separated list of otlp, console and none. Unset, it
//     is otlp when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is
//     set, and none otherwise, so a plain `idemkv serve` sends nothing anywhere.
//   - otlp speaks http/protobuf and reads the OTEL_EXPORTER_OTLP_* variables itself.
//   - console writes spans as JSON to standard output.
//   - OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override service; the SDK reads
//     OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG and OTEL_BSP_*.
//   - OTEL_SDK_DISABLED=true installs no provider.
//
// The shutdown function flushes pending spans; call it before the process exits.
func Setup(ctx context.Context, service string) (shutdown func(context.Context) error, err error) {
	otel.SetTextMapPropagator(newPropagator(propagation.NewCompositeTextMapPropagator(
		propagation.TraceContext{}, propagation.Baggage{})))
	noop := func(context.Context) error { return nil }
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return noop, nil
	}
	exporters, err := exportersFromEnv(ctx)
	if err != nil || len(exporters) == 0 {
		return noop, err
	}
	res, err := resource.New(ctx,
		// Later options win: the environment overrides the name the binary picked.
		resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithFromEnv(),
		resource.WithTelemetrySDK(),
	)
	if err != nil {
		return noop, fmt.Errorf("telemetry: resource: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	for _, exp := range exporters {
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

// Exporters returns the span exporters the OTEL_* environment asks for (see Setup),
// for a program that builds its own tracer provider and wants to honour the same
// variables as the binary. None when nothing is configured.
func Exporters(ctx context.Context) ([]sdktrace.SpanExporter, error) {
	return exportersFromEnv(ctx)
}

func exportersFromEnv(ctx context.Context) ([]sdktrace.SpanExporter, error) {
	names := os.Getenv("OTEL_TRACES_EXPORTER")
	if names == "" {
		if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return nil, nil
		}
		names = "otlp"
	}
	var exporters []sdktrace.SpanExporter
	for _, name := range strings.Split(names, ",") {
		var exp sdktrace.SpanExporter
		var err error
		switch strings.TrimSpace(name) {
		case "none", "":
			continue
		case "otlp":
			if err := otlpProtocolSupported(); err != nil {
				return nil, err
			}
			exp, err = otlptracehttp.New(ctx)
		case "console":
			exp, err = stdouttrace.New()
		default:
			return nil, fmt.Errorf("%w: OTEL_TRACES_EXPORTER=%q (want otlp, console or none)", ErrConfig, name)
		}
		if err != nil {
			return nil, fmt.Errorf("telemetry: %s exporter: %w", name, err)
		}
		exporters = append(exporters, exp)
	}
	return exporters, nil
}

// otlpProtocolSupported refuses grpc rather than silently speaking HTTP to a gRPC
// port: the binary carries the http/protobuf exporter only.
func otlpProtocolSupported() error {
	p := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if p == "" {
		p = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch p {
	case "", "http/protobuf":
		return nil
	}
	return fmt.Errorf("%w: OTLP protocol %q (only http/protobuf is built in)", ErrConfig, p)
}

// Annotate adds attributes to the span in ctx: the API calls it to put the decision
// of a request on the server span that HTTPMiddleware started.
func Annotate(ctx context.Context, attrs ...attribute.KeyValue) {
	trace.SpanFromContext(ctx).SetAttributes(attrs...)
}

// AnnotateRequest puts what a request names (tenant, key, fingerprint, fence, tool) on
// the span in ctx, before it is validated, so that refused requests are findable too.
func AnnotateRequest(ctx context.Context, req any) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(semconv.RequestAttributes(req)...)
	}
}

// Inject writes the trace context of ctx into h (W3C traceparent): a follower that
// forwards a request passes its own span on, so the leader's span is its child rather
// than a sibling under the caller's.
func Inject(ctx context.Context, h http.Header) {
	otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(h))
}

// AnnotateReserve puts a reserve and its decision on the span in ctx.
func AnnotateReserve(ctx context.Context, req *idemkv.ReserveRequest, res *idemkv.ReserveResult) {
	// Building the attributes costs allocations on every reserve; skip it when nothing
	// records them (no exporter configured, or the span was not sampled).
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(semconv.ReserveAttributes(req, res)...)
	}
}
