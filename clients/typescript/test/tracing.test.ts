// Spans against a real idemkv node that exports its own spans (OTEL_TRACES_EXPORTER=
// console): the client's spans, recorded by a tracer that implements @opentelemetry/api's
// Tracer (otel-api.d.ts), carry the Go and Python clients' attribute names, and the node
// continues the trace from the traceparent each request carries.

import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { AsyncLocalStorage } from "node:async_hooks";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type {
  Context as OtelContext, Exception as OtelException, Span as OtelSpan, SpanAttributes, SpanAttributeValue, SpanContext as OtelSpanContext,
  SpanOptions as OtelSpanOptions, SpanStatus, TimeInput, Tracer as OtelTracer,
} from "@opentelemetry/api";
import {
  ApiError, Client, ConflictError, fingerprint, idempotent, OutcomeUnknownError, permanent, run, SCOPE_NAME, StoredFailureError,
  StoreUnavailableError, type ClientOptions,
} from "../src/index.js";
import { ATTR } from "../src/telemetry.js";
import { freePort, killAll, repoRoot, startNode, type IdemkvNode } from "./harness.js";

// Compile-time: an @opentelemetry/api Tracer is what ClientOptions.tracer takes.
export const asClientTracer = (t: OtelTracer): ClientOptions["tracer"] => t;

class RecordedSpan implements OtelSpan {
  attributes: { [key: string]: unknown };
  events: Array<{ name: string; attributes: { [key: string]: unknown } }> = [];
  exceptions: OtelException[] = [];
  status: SpanStatus = { code: 0 };
  ended = false;
  constructor(
    public name: string,
    readonly kind: number,
    attributes: SpanAttributes,
    readonly parent: RecordedSpan | undefined,
    private readonly ctx: OtelSpanContext,
  ) {
    this.attributes = { ...attributes };
  }
  spanContext(): OtelSpanContext {
    return this.ctx;
  }
  setAttribute(key: string, value: SpanAttributeValue): this {
    this.attributes[key] = value;
    return this;
  }
  setAttributes(attributes: SpanAttributes): this {
    Object.assign(this.attributes, attributes);
    return this;
  }
  addEvent(name: string, attributesOrStartTime?: SpanAttributes | TimeInput): this {
    const a = typeof attributesOrStartTime === "object" && !Array.isArray(attributesOrStartTime) && !(attributesOrStartTime instanceof Date)
      ? { ...attributesOrStartTime } : {};
    this.events.push({ name, attributes: a });
    return this;
  }
  addLink(): this {
    return this;
  }
  addLinks(): this {
    return this;
  }
  setStatus(status: SpanStatus): this {
    this.status = status;
    return this;
  }
  updateName(name: string): this {
    this.name = name;
    return this;
  }
  end(): void {
    assert.equal(this.ended, false, `span ${this.name} ended twice`);
    this.ended = true;
  }
  isRecording(): boolean {
    return true;
  }
  recordException(exception: OtelException): void {
    this.exceptions.push(exception);
  }
  eventNames(): string[] {
    return this.events.map((e) => e.name);
  }
}

/**
 * Records spans, and keeps the span of startActiveSpan current for its callback the way
 * OpenTelemetry's AsyncLocalStorage context manager does, so that spans started inside
 * are its children.
 */
class RecordingTracer implements OtelTracer {
  spans: RecordedSpan[] = [];
  private readonly active = new AsyncLocalStorage<RecordedSpan>();
  startSpan(name: string, options: OtelSpanOptions = {}, _context?: OtelContext): RecordedSpan {
    const parent = this.active.getStore();
    const ctx = { traceId: parent?.spanContext().traceId ?? randomBytes(16).toString("hex"), spanId: randomBytes(8).toString("hex"), traceFlags: 1 };
    const s = new RecordedSpan(name, options.kind ?? 0, options.attributes ?? {}, parent, ctx);
    this.spans.push(s);
    return s;
  }
  startActiveSpan<F extends (span: OtelSpan) => unknown>(name: string, fn: F): ReturnType<F>;
  startActiveSpan<F extends (span: OtelSpan) => unknown>(name: string, options: OtelSpanOptions, fn: F): ReturnType<F>;
  startActiveSpan<F extends (span: OtelSpan) => unknown>(name: string, options: OtelSpanOptions, context: OtelContext, fn: F): ReturnType<F>;
  startActiveSpan<F extends (span: OtelSpan) => unknown>(name: string, ...rest: unknown[]): ReturnType<F> {
    const fn = rest[rest.length - 1] as F;
    const span = this.startSpan(name, rest.length > 1 ? (rest[0] as OtelSpanOptions) : {});
    return this.active.run(span, () => fn(span)) as ReturnType<F>;
  }
  /** The span current now (inside a tool), as OpenTelemetry's trace.getActiveSpan(). */
  current(): RecordedSpan | undefined {
    return this.active.getStore();
  }
  named(name: string): RecordedSpan[] {
    return this.spans.filter((s) => s.name === name);
  }
  childrenOf(s: RecordedSpan): string[] {
    return this.spans.filter((c) => c.parent === s).map((c) => c.name);
  }
}

/** A span the node exported (the console exporter writes one JSON object a line). */
interface ServerSpan {
  Name: string;
  SpanContext: { TraceID: string; SpanID: string };
  Parent: { TraceID: string; SpanID: string; Remote: boolean };
  Attributes: Array<{ Key: string; Value: { Value: unknown } }> | null;
}

function serverSpans(node: IdemkvNode): ServerSpan[] {
  return node.log.split("\n").filter((l) => l.startsWith('{"Name":')).map((l) => JSON.parse(l) as ServerSpan);
}

/** Waits for the node's span of the request that the client span `of` sent. */
async function serverSpanOf(node: IdemkvNode, of: RecordedSpan): Promise<ServerSpan> {
  const { traceId, spanId } = of.spanContext();
  const end = Date.now() + 10_000;
  for (;;) {
    const s = serverSpans(node).find((x) => x.Parent.SpanID === spanId);
    if (s !== undefined) {
      assert.equal(s.Parent.TraceID, traceId);
      return s;
    }
    if (Date.now() > end) throw new Error(`the node exported no span whose parent is ${spanId} (${of.name}):\n${node.log.slice(-4000)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const TENANT = "tenant_spans";
let node: IdemkvNode;
let seq = 0;
const newKey = (what: string) => `ts:spans:${what}:${Date.now()}:${++seq}`;

before(async () => {
  // The batch exporter's delay is 5 s by default; the test waits for the node's spans.
  node = await startNode([], { OTEL_TRACES_EXPORTER: "console", OTEL_BSP_SCHEDULE_DELAY: "20" });
});
after(killAll);

function traced(extra: ClientOptions = {}): { client: Client; tracer: RecordingTracer } {
  const tracer = new RecordingTracer();
  return { client: new Client({ endpoints: [node.httpAddr], tracer, ...extra }), tracer };
}

/** create_ticket, wrapped; calls counts the runs of the function, spanInside the span current while it ran. */
function createTicket(client: Client, tracer: RecordingTracer) {
  const state = { calls: 0, spanInside: undefined as RecordedSpan | undefined };
  const create = idempotent(async (a: { key: string; title: string }) => {
    state.calls++;
    state.spanInside = tracer.current();
    return { id: `LIN-${state.calls}`, title: a.title };
  }, {
    client, tenant: TENANT, tool: "create_ticket", key: (a) => a.key, effect: (a) => ({ title: a.title }),
    receipt: (t) => ({ remoteSystem: "linear", remoteId: t.id }),
  });
  return { create, state };
}

describe("spans", () => {
  it("the attribute keys are the Go client's (telemetry/semconv)", () => {
    const src = readFileSync(join(repoRoot, "telemetry", "semconv", "semconv.go"), "utf8");
    const goKeys = new Set([...src.matchAll(/attribute\.Key\("([^"]+)"\)/g)].map((m) => m[1]));
    const ours = Object.values(ATTR);
    assert.ok(ours.length >= 15, `${ours.length} keys`);
    assert.deepEqual(ours.filter((k) => !goKeys.has(k)), []);
    assert.equal(SCOPE_NAME, "github.com/idemkv/idemkv/clients/typescript");
  });

  it("a fresh execute: a tool-call span, its store calls as children, and the node continues the trace", async (t) => {
    const { client, tracer } = traced();
    const { create, state } = createTicket(client, tracer);
    const key = newKey("execute");
    await create({ key, title: "Outage X" });
    assert.equal(state.calls, 1);

    const [span] = tracer.named("execute_tool create_ticket");
    assert.ok(span !== undefined, `spans: ${tracer.spans.map((s) => s.name)}`);
    assert.equal(span.parent, undefined);
    assert.equal(span.kind, 0);
    const a = span.attributes;
    assert.deepEqual(
      [a[ATTR.TOOL_NAME], a[ATTR.TOOL_SIDE_EFFECT], a[ATTR.TOOL_CLASS], a[ATTR.IDEMPOTENCY_KEY], a[ATTR.TENANT], a[ATTR.DECISION],
        a[ATTR.ATTEMPTS], a[ATTR.REPLAYED], a[ATTR.RECEIPT_REMOTE_ID]],
      ["create_ticket", true, "non_idempotent_mutation", key, TENANT, "execute", 1, false, "LIN-1"]);
    assert.equal(a[ATTR.FINGERPRINT], fingerprint({ title: "Outage X" }));
    assert.ok(typeof a[ATTR.FENCE] === "number" && a[ATTR.FENCE] as number > 0, `fence ${a[ATTR.FENCE]}`);
    assert.deepEqual(span.eventNames(), ["reserve"]);
    assert.equal(span.events[0].attributes[ATTR.DECISION], "execute");
    assert.equal(span.status.code, 0);
    assert.equal(span.exceptions.length, 0);
    // The tool ran with the tool-call span current: its own spans would be children.
    assert.equal(state.spanInside, span);

    assert.deepEqual(tracer.childrenOf(span), ["POST /v1/reserve", "POST /v1/commit"]);
    const [reserve] = tracer.named("POST /v1/reserve");
    const r = reserve.attributes;
    assert.equal(reserve.kind, 2);
    assert.deepEqual([r["http.request.method"], r["url.full"], r["server.address"], r["http.response.status_code"]],
      ["POST", `http://${node.httpAddr}/v1/reserve`, node.httpAddr, 200]);
    assert.deepEqual([r[ATTR.TENANT], r[ATTR.IDEMPOTENCY_KEY], r[ATTR.TOOL_NAME]], [TENANT, key, "create_ticket"]);
    assert.match(String(r[ATTR.ATTEMPT_ID]), /^att_[0-9a-f]{24}$/);
    const [commit] = tracer.named("POST /v1/commit");
    assert.equal(commit.attributes[ATTR.FENCE], a[ATTR.FENCE]);
    assert.ok(tracer.spans.every((s) => s.ended), "every span ended");

    // The node's span of each request is a child of the client span that sent it.
    for (const client of [reserve, commit]) {
      const srv = await serverSpanOf(node, client);
      assert.equal(srv.Name, client.name);
      assert.equal(srv.SpanContext.TraceID, span.spanContext().traceId);
      assert.equal(srv.Parent.Remote, true);
      t.diagnostic(`${client.name}: client span ${client.spanContext().spanId} -> node span ${srv.SpanContext.SpanID}` +
        ` (trace ${srv.SpanContext.TraceID})`);
    }
    const srvAttrs = new Map(((await serverSpanOf(node, reserve)).Attributes ?? []).map((kv) => [kv.Key, kv.Value.Value]));
    assert.equal(srvAttrs.get(ATTR.DECISION), "execute");
  });

  it("a replay: the function is not called, and the span says replayed", async () => {
    const { client, tracer } = traced();
    const { create, state } = createTicket(client, tracer);
    const key = newKey("replay");
    await create({ key, title: "Outage X" });
    tracer.spans = [];
    const again = await create({ key, title: "Outage X" });
    assert.equal(state.calls, 1);
    assert.equal(again.id, "LIN-1");
    const [span] = tracer.named("execute_tool create_ticket");
    const a = span.attributes;
    assert.deepEqual([a[ATTR.DECISION], a[ATTR.REPLAYED], a[ATTR.RECEIPT_REMOTE_ID]], ["replay", true, "LIN-1"]);
    // No fence is granted to a replay (the Go and Python clients put none on the span either).
    assert.deepEqual([a[ATTR.FENCE], a[ATTR.ATTEMPTS]], [undefined, 1]);
    assert.deepEqual(tracer.childrenOf(span), ["POST /v1/reserve"]);
    assert.equal(span.status.code, 0);
    await serverSpanOf(node, tracer.named("POST /v1/reserve")[0]);
  });

  it("a conflict: the span names the receipt it hit and records the error", async () => {
    const { client, tracer } = traced();
    const { create, state } = createTicket(client, tracer);
    const key = newKey("conflict");
    await create({ key, title: "Outage X" });
    tracer.spans = [];
    await assert.rejects(create({ key, title: "Outage Y" }), ConflictError);
    assert.equal(state.calls, 1);
    const [span] = tracer.named("execute_tool create_ticket");
    const a = span.attributes;
    assert.deepEqual(
      [a[ATTR.DECISION], a[ATTR.CONFLICT_REASON], a[ATTR.CONFLICT_EXISTING_FINGERPRINT], a[ATTR.CONFLICT_EXISTING_REMOTE_ID]],
      ["conflict", "idempotency_key_reused_with_different_effect", fingerprint({ title: "Outage X" }), "LIN-1"]);
    assert.equal(a[ATTR.FINGERPRINT], fingerprint({ title: "Outage Y" }));
    assert.equal(a[ATTR.REPLAYED], undefined);
    assert.equal(span.exceptions.length, 1);
    const err = span.exceptions[0];
    assert.ok(err instanceof ConflictError && err.kind === "conflict");
    assert.equal(span.status.code, 2);
    assert.match(String(span.status.message), /^idemkv: conflict on /);
    assert.ok(span.ended);
  });

  it("errors: a failing tool leaves the record pending, a permanent one is stored, a refused call is an error span", async () => {
    const { client, tracer } = traced();
    const base = { tenant: TENANT, tool: "send_mail", effect: { to: "a@example.com" } };

    await assert.rejects(run(client, { ...base, key: newKey("unknown") }, async () => {
      throw new Error("smtp timed out");
    }), OutcomeUnknownError);
    let [span] = tracer.named("execute_tool send_mail");
    assert.deepEqual(span.eventNames(), ["reserve", "left_pending"]);
    assert.equal(span.status.code, 2);
    assert.equal((span.exceptions[0] as OutcomeUnknownError).kind, "outcome_unknown");
    assert.deepEqual(tracer.childrenOf(span), ["POST /v1/reserve"]);

    tracer.spans = [];
    await assert.rejects(run(client, { ...base, key: newKey("permanent") }, async () => {
      throw permanent(new Error("mailbox does not exist"), { code: "no_mailbox" });
    }), StoredFailureError);
    [span] = tracer.named("execute_tool send_mail");
    assert.equal((span.exceptions[0] as StoredFailureError).kind, "stored_failure");
    assert.deepEqual(tracer.childrenOf(span), ["POST /v1/reserve", "POST /v1/fail"]);
    assert.equal(tracer.named("POST /v1/fail")[0].status.code, 0);

    // A store call the node refuses: the span has the status code and the error.
    tracer.spans = [];
    const key = newKey("absent");
    await assert.rejects(client.get(TENANT, key), (e: unknown) => e instanceof ApiError && e.code === "not_found");
    const [get] = tracer.named("GET /v1/records/{tenant}/{key}");
    assert.deepEqual([get.attributes["http.response.status_code"], get.attributes[ATTR.TENANT], get.attributes[ATTR.IDEMPOTENCY_KEY]],
      [404, TENANT, key]);
    assert.equal(get.status.code, 2);
    assert.equal((get.exceptions[0] as ApiError).code, "not_found");
    assert.equal(get.parent, undefined);
    const srv = await serverSpanOf(node, get);
    assert.equal(srv.Name, "GET /v1/records/{tenant}/{key...}"); // the node's route pattern
  });

  it("a store that does not answer: each attempt is an error span, and the tool call says store_unavailable", async () => {
    const dead = `127.0.0.1:${await freePort()}`;
    const { client, tracer } = traced({ endpoints: [dead], storeWait: 300, backoffMinMs: 10, backoffMaxMs: 50 });
    let calls = 0;
    await assert.rejects(run(client, { tenant: TENANT, key: newKey("down"), tool: "send_mail", effect: { n: 1 } }, async () => {
      calls++;
      return { remoteSystem: "mail", remoteId: "m1" };
    }), StoreUnavailableError);
    assert.equal(calls, 0);
    const [span] = tracer.named("execute_tool send_mail");
    assert.deepEqual(span.eventNames(), ["store_unavailable"]);
    assert.equal(span.attributes[ATTR.DECISION], undefined);
    assert.equal((span.exceptions[0] as StoreUnavailableError).kind, "store_unavailable");
    const attempts = tracer.named("POST /v1/reserve");
    assert.ok(attempts.length >= 2, `${attempts.length} attempts`);
    for (const s of attempts) {
      assert.equal(s.parent, span);
      assert.equal(s.status.code, 2);
      assert.equal((s.exceptions[0] as ApiError).code, "unavailable");
      assert.equal(s.attributes["http.response.status_code"], undefined);
      assert.equal(s.attributes["server.address"], dead);
    }
  });

  it("traceparent: version 00, the span's ids and flags; none without a tracer or a valid span context", async () => {
    const sent: Array<string | null> = [];
    const capture: typeof fetch = (input, init) => {
      sent.push(new Headers(init?.headers).get("traceparent"));
      return fetch(input, init);
    };
    const key = newKey("headers");
    const req = { tenant: TENANT, idempotency_key: key, tool: "t", effect_fingerprint: fingerprint({ n: 1 }) };

    const tracer = new RecordingTracer();
    await new Client({ endpoints: [node.httpAddr], tracer, fetch: capture }).reserve(req);
    const sc = tracer.spans[0].spanContext();
    assert.equal(sent[0], `00-${sc.traceId}-${sc.spanId}-01`);
    assert.match(String(sent[0]), /^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/);

    // Flags as the span has them (not sampled: 00), and tracestate along.
    const unsampled = {
      startSpan: () => ({
        ...noopSpan,
        spanContext: () => ({ traceId: "4bf92f3577b34da6a3ce929d0e0e4736", spanId: "00f067aa0ba902b7", traceFlags: 0,
          traceState: { serialize: () => "vendor=x" } }),
      }),
    };
    const states: Array<string | null> = [];
    const captureState: typeof fetch = (input, init) => {
      sent.push(new Headers(init?.headers).get("traceparent"));
      states.push(new Headers(init?.headers).get("tracestate"));
      return fetch(input, init);
    };
    await new Client({ endpoints: [node.httpAddr], tracer: unsampled, fetch: captureState }).get(TENANT, key);
    assert.equal(sent[1], "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
    assert.equal(states[0], "vendor=x");

    // OpenTelemetry's non-recording span has all-zero ids: nothing to continue.
    const invalid = {
      startSpan: () => ({ ...noopSpan, spanContext: () => ({ traceId: "0".repeat(32), spanId: "0".repeat(16), traceFlags: 0 }) }),
    };
    await new Client({ endpoints: [node.httpAddr], tracer: invalid, fetch: capture }).get(TENANT, key);
    await new Client({ endpoints: [node.httpAddr], fetch: capture }).get(TENANT, key);
    assert.deepEqual(sent.slice(2), [null, null]);
  });

  it("a tracer with startSpan alone: the same spans, not linked to the tool call's", async () => {
    const rec = new RecordingTracer();
    const tracer = { startSpan: (name: string, options?: OtelSpanOptions) => rec.startSpan(name, options) };
    const client = new Client({ endpoints: [node.httpAddr], tracer });
    await run(client, { tenant: TENANT, key: newKey("plain"), tool: "create_ticket", effect: { n: 2 } },
      async () => ({ remoteSystem: "linear", remoteId: "LIN-9" }));
    assert.deepEqual(rec.spans.map((s) => s.name), ["execute_tool create_ticket", "POST /v1/reserve", "POST /v1/commit"]);
    assert.ok(rec.spans.every((s) => s.parent === undefined && s.ended));
    assert.equal(rec.spans[0].attributes[ATTR.RECEIPT_REMOTE_ID], "LIN-9");
    const srv = await serverSpanOf(node, rec.spans[1]);
    assert.equal(srv.SpanContext.TraceID, rec.spans[1].spanContext().traceId);
  });

  it("a tracer without startSpan is refused", () => {
    assert.throws(() => new Client({ tracer: {} as unknown as OtelTracer }), /tracer must have startSpan/);
  });
});

const noopSpan = {
  setAttribute: () => undefined,
  setAttributes: () => undefined,
  setStatus: () => undefined,
  recordException: () => undefined,
  end: () => undefined,
};
