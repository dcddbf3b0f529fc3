package telemetry

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/idemkv/idemkv"
)

// withGlobals restores the global tracer provider and propagator after the test.
func withGlobals(t *testing.T) {
	t.Helper()
	tp, prop := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	t.Cleanup(func() {
		otel.SetTracerProvider(tp)
		otel.SetTextMapPropagator(prop)
	})
}

func recordSpans(t *testing.T) *tracetest.SpanRecorder {
	t.Helper()
	withGlobals(t)
	rec := tracetest.NewSpanRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return rec
}

func attrMap(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := make(map[attribute.Key]attribute.Value, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestHTTPMiddlewareContinuesTraceAndNamesRoute(t *testing.T) {
	rec := recordSpans(t)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/reserve", func(w http.ResponseWriter, r *http.Request) {
		req := &idemkv.ReserveRequest{Tenant: "t1", Key: "conv:9/appr:17", Tool: "create_ticket", Fingerprint: "sha256:aa"}
		res := &idemkv.ReserveResult{Decision: idemkv.DecisionReplay, Fence: 42,
			Receipt: &idemkv.Receipt{RemoteID: "LIN-1842"}}
		AnnotateReserve(r.Context(), req, res)
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("GET /v1/records/{tenant}/{key...}", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "boom", http.StatusInternalServerError)
	})
	srv := httptest.NewServer(HTTPMiddleware(mux))
	t.Cleanup(srv.Close)

	// The caller's span: its context must become the parent of the server span.
	parentTP := sdktrace.NewTracerProvider()
	ctx, parent := parentTP.Tracer("caller").Start(context.Background(), "caller")
	defer parent.End()
	send := func(method, path string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	send("POST", "/v1/reserve")
	send("GET", "/v1/records/t1/conv:9%2Fappr:17")

	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	reserve, get := spans[0], spans[1]
	if reserve.Name() != "POST /v1/reserve" {
		t.Errorf("span name %q", reserve.Name())
	}
	if get.Name() != "GET /v1/records/{tenant}/{key...}" {
		t.Errorf("span name %q must be the route, not the path", get.Name())
	}
	for _, s := range spans {
		if s.SpanKind() != trace.SpanKindServer {
			t.Errorf("%s: kind %v", s.Name(), s.SpanKind())
		}
		if s.Parent().TraceID() != parent.SpanContext().TraceID() || s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("%s: parent %v, want the caller's span %v", s.Name(), s.Parent(), parent.SpanContext())
		}
		if !s.Parent().IsRemote() {
			t.Errorf("%s: parent is not marked remote", s.Name())
		}
	}
	a := attrMap(reserve.Attributes())
	want := map[attribute.Key]attribute.Value{
		Decision:                    attribute.StringValue("replay"),
		IdempotencyKey:              attribute.StringValue("conv:9/appr:17"),
		Tenant:                      attribute.StringValue("t1"),
		ToolName:                    attribute.StringValue("create_ticket"),
		Fingerprint:                 attribute.StringValue("sha256:aa"),
		Fence:                       attribute.Int64Value(42),
		ReceiptRemoteID:             attribute.StringValue("LIN-1842"),
		"http.route":                attribute.StringValue("/v1/reserve"),
		"http.response.status_code": attribute.IntValue(200),
	}
	for k, v := range want {
		if a[k] != v {
			t.Errorf("reserve span %s = %v, want %v", k, a[k].String(), v.String())
		}
	}
	if reserve.Status().Code == codes.Error {
		t.Error("a 200 marked the span as failed")
	}
	if get.Status().Code != codes.Error {
		t.Errorf("a 500 left status %v", get.Status())
	}
	if got := attrMap(get.Attributes())["http.response.status_code"]; got != attribute.IntValue(500) {
		t.Errorf("status code attribute %v", got.String())
	}
}

func TestHTTPMiddlewareUnmatchedRoute(t *testing.T) {
	rec := recordSpans(t)
	srv := httptest.NewServer(HTTPMiddleware(http.NewServeMux()))
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/secret/tenant/key")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	spans := rec.Ended()
	if len(spans) != 1 || spans[0].Name() != "GET" {
		t.Fatalf("spans %v: want one named after the method alone", spans)
	}
}

func TestSetupDefaultsToNoExporter(t *testing.T) {
	withGlobals(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator())
	before := otel.GetTracerProvider()

	shutdown, err := Setup(context.Background(), "idemkv")
	if err != nil {
		t.Fatal(err)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if otel.GetTracerProvider() != before {
		t.Error("a tracer provider was installed without any exporter configured")
	}
	fields := otel.GetTextMapPropagator().Fields()
	if !contains(fields, "traceparent") || !contains(fields, "baggage") {
		t.Errorf("propagator fields %v, want traceparent and baggage", fields)
	}
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

func TestSetupRejectsWhatItCannotHonour(t *testing.T) {
	withGlobals(t)
	cases := map[string]map[string]string{
		"unknown exporter": {"OTEL_TRACES_EXPORTER": "zipkin"},
		"grpc protocol":    {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
		"grpc for traces":  {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"},
	}
	for name, env := range cases {
		t.Run(name, func(t *testing.T) {
			for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
				t.Setenv(k, env[k])
			}
			if _, err := Setup(context.Background(), "idemkv"); !errors.Is(err, ErrConfig) {
				t.Fatalf("got %v, want ErrConfig", err)
			}
		})
	}
}

func TestSetupDisabled(t *testing.T) {
	withGlobals(t)
	t.Setenv("OTEL_SDK_DISABLED", "true")
	t.Setenv("OTEL_TRACES_EXPORTER", "zipkin") // would fail if it were read
	before := otel.GetTracerProvider()
	if _, err := Setup(context.Background(), "idemkv"); err != nil {
		t.Fatal(err)
	}
	if otel.GetTracerProvider() != before {
		t.Error("OTEL_SDK_DISABLED=true still installed a provider")
	}
}

func TestExportersFromEnv(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "console, none")
	exps, err := exportersFromEnv(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(exps) != 1 {
		t.Fatalf("%d exporters, want 1", len(exps))
	}
	if _, ok := exps[0].(*stdouttrace.Exporter); !ok {
		t.Fatalf("exporter %T, want the console exporter", exps[0])
	}
}

// TestSetupOTLP runs the real OTLP/HTTP exporter against a local collector stand-in
// and decodes what it receives.
func TestSetupOTLP(t *testing.T) {
	withGlobals(t)
	var (
		mu   sync.Mutex
		reqs []*collectortrace.ExportTraceServiceRequest
	)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil || r.URL.Path != "/v1/traces" {
			t.Errorf("collector got %s %s: %v", r.Method, r.URL.Path, err)
			return
		}
		var req collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			t.Errorf("collector: %v", err)
			return
		}
		mu.Lock()
		reqs = append(reqs, &req)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(collector.Close)
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_SERVICE_NAME", "idemkv-from-env")
	t.Setenv("OTEL_TRACES_SAMPLER", "always_on")

	shutdown, err := Setup(context.Background(), "idemkv")
	if err != nil {
		t.Fatal(err)
	}
	_, span := otel.Tracer("test").Start(context.Background(), "reserve-span")
	span.SetAttributes(Decision.String("execute"))
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	var found bool
	for _, req := range reqs {
		for _, rs := range req.ResourceSpans {
			var service string
			for _, kv := range rs.Resource.Attributes {
				if kv.Key == "service.name" {
					service = kv.Value.GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					if s.Name != "reserve-span" {
						continue
					}
					found = true
					if service != "idemkv-from-env" {
						t.Errorf("service.name %q: OTEL_SERVICE_NAME must win", service)
					}
					if len(s.Attributes) != 1 || s.Attributes[0].Value.GetStringValue() != "execute" {
						t.Errorf("attributes %v", s.Attributes)
					}
				}
			}
		}
	}
	if !found {
		t.Fatalf("the collector never received the span (%d requests)", len(reqs))
	}
}

// setUpAsServe sets the globals up as a plain `idemkv serve` has them: Setup with no
// exporter configured, so the W3C propagator and OpenTelemetry's own provider.
func setUpAsServe(t *testing.T) {
	t.Helper()
	withGlobals(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	if otel.GetTracerProvider() != defaultTracerProvider {
		otel.SetTracerProvider(defaultTracerProvider)
	}
	if _, err := Setup(context.Background(), "idemkv"); err != nil {
		t.Fatal(err)
	}
}

// TestUntracedOnlyWhileNothingIsSetUp: a request skips its span only while no tracer
// provider is set up and it carries none of the propagator's headers. The case that
// matters is a plain `idemkv serve`: Setup installs the W3C propagator and, without an
// exporter, no provider; its requests skipped nothing until untraced looked at the
// request's headers rather than at whether any propagator had been installed.
func TestUntracedOnlyWhileNothingIsSetUp(t *testing.T) {
	setUpAsServe(t)
	plain := http.Header{"Content-Type": {"application/json"}, "Authorization": {"Bearer x"}}
	if !untraced(plain) {
		t.Fatal("Setup without an exporter: a request that carries no trace still starts a span")
	}
	for _, name := range []string{"Traceparent", "traceparent", "Tracestate", "Baggage"} {
		h := plain.Clone()
		h[name] = []string{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
		if untraced(h) {
			t.Errorf("a request with a %s header counts as carrying no trace", name)
		}
	}

	// A propagator of another kind (not Setup's): its own header names count.
	otel.SetTextMapPropagator(propagation.Baggage{})
	if !untraced(http.Header{"Traceparent": {"x"}}) {
		t.Error("a header the propagator does not read counts as a trace")
	}
	if untraced(http.Header{"Baggage": {"k=v"}}) {
		t.Error("a header the propagator reads counts as no trace")
	}

	otel.SetTracerProvider(sdktrace.NewTracerProvider())
	if untraced(plain) {
		t.Fatal("a tracer provider of its own counts as nothing set up")
	}
}

// TestForwardedTraceContinuesWithoutAProvider: with Setup's propagator and no
// provider (no exporter here), a request that carries a traceparent still gets the
// caller's trace in its context, for a follower to pass on to the leader; one that
// carries none gets no span context at all.
func TestForwardedTraceContinuesWithoutAProvider(t *testing.T) {
	setUpAsServe(t)
	var got trace.SpanContext
	h := HTTPMiddleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = trace.SpanContextFromContext(r.Context())
	}))
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	req := httptest.NewRequest(http.MethodPost, "/v1/reserve", nil)
	req.Header.Set("traceparent", parent)
	h.ServeHTTP(httptest.NewRecorder(), req)
	if !got.IsValid() || got.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" {
		t.Fatalf("span context %v: the caller's trace was not carried on", got)
	}
	got = trace.SpanContext{}
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/v1/reserve", nil))
	if got.IsValid() {
		t.Fatalf("span context %v for a request that carried no trace", got)
	}
}
