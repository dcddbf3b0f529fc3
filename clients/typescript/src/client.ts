// The low-level client: one method per endpoint of idemkv's HTTP API, leader
// discovery through the Idemkv-Leader header, several endpoints, and retries with
// backoff of the answers that say "nothing happened, or it is safe to ask again"
// (unavailable, outcome_unknown, a transport failure: outcome_unknown for a write that
// may have been sent, unavailable otherwise). The tool-call loop is in idempotent.ts.

import { ApiError, type ApiErrorDetails, ApprovalMismatchError, ApprovalNotPendingError, isRetryable, WIRE_CODES, type WireCode } from "./errors.js";
import { ATTR, failSpan, SPAN_KIND_CLIENT, traceHeaders, type Attributes, type Tracer } from "./telemetry.js";
import { fetchSend, nodeSend, type HttpResponse, type Send, type TlsOptions } from "./transport.js";
import type {
  ApprovalRule, ApprovalsOptions, ApprovalsResult, ClusterInfo, CommitRequest, DecideApprovalRequest, DoubtRequest, FailRequest, GetOptions, HeartbeatRequest, ListOptions, ListResult,
  Receipt, Record as IdemkvRecord, ReleaseRequest, ReleaseResult, ReserveRequest, ReserveResult, ResolveRequest, Tombstone,
} from "./types.js";
import { abortReason, backoff, linkedController, newAttemptId, sleep } from "./util.js";

export interface ClientOptions {
  /**
   * API addresses of some or all nodes, as host:port or http(s)://host:port. The client
   * goes to the leader any node names, and falls back to these in turn. Default
   * ["127.0.0.1:7420"].
   */
  endpoints?: string[];
  /** Sent as "Authorization: Bearer <token>". */
  token?: string;
  /** TLS settings; endpoints without a scheme then use https (see transport.ts). */
  tls?: TlsOptions;
  /** Bound on one HTTP attempt, in ms; a long-poll gets its wait on top. Default 10000. */
  timeoutMs?: number;
  /** Attempts of one low-level call across endpoints. Default 8. */
  maxAttempts?: number;
  /** Bounds of the jittered exponential backoff between attempts, in ms. Defaults 20 and 1000. */
  backoffMinMs?: number;
  backoffMaxMs?: number;

  // The tool-call loop (idempotent, run):

  /**
   * How long the loop waits for idemkv, in ms, before it gives up with
   * StoreUnavailableError (before the tool ran) or OutcomeUnknownError (after). Default
   * 30000.
   */
  storeWait?: number;
  /**
   * Before a tool runs, how long the loop waits, in ms, while every endpoint refuses
   * connections (nobody listens: the cluster is down or the address is wrong), so that an
   * interactive agent hears within seconds instead of storeWait. Any answer, such as a 503
   * during a leader election, means a node is there, and storeWait applies. Default 3000.
   */
  connectWait?: number;
  /**
   * What the loop does when idemkv cannot be reached within storeWait before the tool
   * ran: "fail_closed" (default) throws StoreUnavailableError; "unguarded" runs
   * read-only and idempotent tools anyway, unrecorded (never non-idempotent ones).
   */
  onStoreUnavailable?: "fail_closed" | "unguarded";
  /** Lease of a call that names none, in ms (at least 1000). The loop heartbeats every third of it. Default 30000. */
  leaseTtl?: number;
  /** Longest single long-poll while another attempt holds the key, in ms. Default 30000. */
  pollWait?: number;

  /** Replaces the global fetch (tests, proxies). Ignored when tls is set. */
  fetch?: typeof fetch;

  /**
   * Makes OpenTelemetry spans: one per HTTP attempt of a store call ("POST /v1/reserve"),
   * whose W3C traceparent the request carries, and one per tool call of the loop
   * ("execute_tool <tool>"). An @opentelemetry/api Tracer fits:
   * `trace.getTracer(SCOPE_NAME)`. Default: none, and no spans.
   */
  tracer?: Tracer;
}

export interface CallOptions {
  signal?: AbortSignal;
  /**
   * Instead of stopping after maxAttempts, keep retrying retryable failures until the
   * budget is spent. Time counts while the store does not answer (failed attempts and
   * the backoff between them, not a long-poll's own wait); several calls may share
   * one budget, as the calls of one tool call do.
   */
  budget?: StoreBudget;
}

/** Time, in ms, that calls may spend waiting for a store that does not answer. */
export interface StoreBudget {
  limitMs: number;
  spentMs: number;
  /**
   * Bounds the time, in ms, while no endpoint even accepts a connection (nobody listens);
   * an answer of any node lifts it to limitMs (sets answered).
   */
  connectWaitMs?: number;
  answered?: boolean;
}

const DEFAULTS = {
  endpoints: ["127.0.0.1:7420"],
  timeoutMs: 10_000,
  maxAttempts: 8,
  backoffMinMs: 20,
  backoffMaxMs: 1000,
  storeWait: 30_000,
  connectWait: 3_000,
  leaseTtl: 30_000,
  pollWait: 30_000,
};

/** How long a leader that gave no answer at all is not followed again (Go's leaderShun). */
const LEADER_SHUN_MS = 10_000;

/** The longest long-poll the server takes (5 minutes). */
export const MAX_WAIT_MS = 300_000;

function baseURL(ep: string, useTLS: boolean): string {
  const withScheme = ep.includes("://") ? ep : `${useTLS ? "https" : "http"}://${ep}`;
  let u: URL;
  try {
    u = new URL(withScheme);
  } catch {
    throw new TypeError(`idemkv: endpoint ${JSON.stringify(ep)} must be host:port or http(s)://host:port`);
  }
  if ((u.protocol !== "http:" && u.protocol !== "https:") || u.host === "" || (u.pathname !== "/" && u.pathname !== "") ||
    u.search !== "" || u.username !== "") {
    throw new TypeError(`idemkv: endpoint ${JSON.stringify(ep)} must be host:port or http(s)://host:port`);
  }
  return `${u.protocol}//${u.host}`;
}

/** A path segment that is "." or "..", escaped (see segment). */
const DOT_SEGMENT = /\/(%2E)+(\/|$)/;

/** A path segment, escaped; "." and ".." would be cleaned away by a server's router. */
function segment(s: string): string {
  const e = encodeURIComponent(s);
  return /^\.+$/.test(e) ? "%2E".repeat(e.length) : e;
}

interface Call {
  method: "GET" | "POST";
  /** The path's pattern, for span names: "/v1/records/{tenant}/{key}". */
  route: string;
  path: string;
  /** What the call names, for its span; called only when there is a tracer. */
  attrs?: () => Attributes;
  query?: URLSearchParams;
  body?: unknown;
  /** A long-poll's wait, added to the attempt's timeout. */
  waitMs?: number;
}

/** Resolved options, shared with the loop. */
export interface Settings {
  timeoutMs: number;
  maxAttempts: number;
  backoffMinMs: number;
  backoffMaxMs: number;
  storeWait: number;
  connectWait: number;
  onStoreUnavailable: "fail_closed" | "unguarded";
  leaseTtl: number;
  pollWait: number;
}

/** A client of an idemkv cluster. Safe to share across calls; close() when done. */
export class Client {
  readonly settings: Settings;
  /** The tracer of ClientOptions, or undefined. */
  readonly tracer: Tracer | undefined;
  private readonly endpoints: string[];
  private readonly scheme: string;
  private readonly token: string | undefined;
  private readonly send: Send;
  private readonly closeTransport: () => void;
  private readonly viaFetch: boolean;
  /** For paths fetch would rewrite (dot segments), made when first needed. */
  private raw: { send: Send; close: () => void } | undefined;
  private leaderURL = "";
  /**
   * Leaders that gave no answer at all to an attempt, and until when (Date.now()) they
   * are not followed again (Go's leaderShun): a node names the leader's advertised
   * address, which a client outside the cluster's network may never reach; followed on
   * every answer, it cost every call a failed attempt, up to the whole timeout.
   */
  private readonly unreached = new Map<string, number>();
  /** The endpoint tried first while no leader is known; moves on when it fails. */
  private preferred = 0;

  constructor(options: ClientOptions = {}) {
    const eps = options.endpoints ?? DEFAULTS.endpoints;
    if (eps.length === 0) throw new TypeError("idemkv: endpoints must name at least one node");
    this.endpoints = eps.map((e) => baseURL(e, options.tls !== undefined));
    this.scheme = this.endpoints[0].startsWith("https:") ? "https" : "http";
    this.token = options.token;
    const num = (v: number | undefined, def: number, name: string, min: number) => {
      const x = v ?? def;
      if (!Number.isFinite(x) || x < min) throw new TypeError(`idemkv: ${name} must be a number >= ${min}`);
      return x;
    };
    this.settings = {
      timeoutMs: num(options.timeoutMs, DEFAULTS.timeoutMs, "timeoutMs", 1),
      maxAttempts: num(options.maxAttempts, DEFAULTS.maxAttempts, "maxAttempts", 1),
      backoffMinMs: num(options.backoffMinMs, DEFAULTS.backoffMinMs, "backoffMinMs", 0),
      backoffMaxMs: num(options.backoffMaxMs, DEFAULTS.backoffMaxMs, "backoffMaxMs", 0),
      storeWait: num(options.storeWait, DEFAULTS.storeWait, "storeWait", 0),
      connectWait: num(options.connectWait, DEFAULTS.connectWait, "connectWait", 1),
      onStoreUnavailable: options.onStoreUnavailable ?? "fail_closed",
      leaseTtl: num(options.leaseTtl, DEFAULTS.leaseTtl, "leaseTtl", 1000),
      pollWait: Math.min(num(options.pollWait, DEFAULTS.pollWait, "pollWait", 1), MAX_WAIT_MS),
    };
    if (this.settings.backoffMaxMs < this.settings.backoffMinMs) {
      throw new TypeError("idemkv: need backoffMinMs <= backoffMaxMs");
    }
    if (this.settings.onStoreUnavailable !== "fail_closed" && this.settings.onStoreUnavailable !== "unguarded") {
      throw new TypeError('idemkv: onStoreUnavailable must be "fail_closed" or "unguarded"');
    }
    if (options.tracer !== undefined && (options.tracer === null || typeof options.tracer.startSpan !== "function")) {
      throw new TypeError("idemkv: tracer must have startSpan (an OpenTelemetry Tracer)");
    }
    this.tracer = options.tracer;
    if (options.tls !== undefined) {
      const t = nodeSend(options.tls);
      this.send = t.send;
      this.closeTransport = t.close;
      this.viaFetch = false;
    } else {
      this.viaFetch = true;
      this.send = fetchSend(options.fetch ?? globalThis.fetch);
      this.closeTransport = () => this.raw?.close();
    }
  }

  /** Releases the connections of the node:http(s) transport (fetch's pool needs nothing). */
  close(): void {
    this.closeTransport();
  }

  /** The base URL of the leader as last reported, or "". */
  get leader(): string {
    return this.leaderURL;
  }

  private setLeader(addr: string): void {
    let u: string;
    try {
      u = baseURL(addr, this.scheme === "https");
    } catch {
      return;
    }
    // Another scheme than the endpoints' is not followed: from https to http it would
    // send the token and every request in plain text.
    if (!u.startsWith(`${this.scheme}://`)) return;
    // A node bound to a wildcard address advertises nothing a client can dial.
    const host = new URL(u).hostname;
    if (host === "" || host === "0.0.0.0" || host === "[::]") return;
    if (!addr.includes("://")) u = `${this.scheme}://${new URL(u).host}`;
    if ((this.unreached.get(u) ?? 0) > Date.now()) return;
    this.leaderURL = u;
  }

  private demote(base: string, unreached: boolean): void {
    if (this.leaderURL === base && unreached) {
      const now = Date.now();
      for (const [u, until] of this.unreached) if (until <= now) this.unreached.delete(u);
      this.unreached.set(base, now + LEADER_SHUN_MS);
    }
    if (this.leaderURL === base) this.leaderURL = "";
    if (this.endpoints[this.preferred % this.endpoints.length] === base) this.preferred++;
  }

  private target(): string {
    return this.leaderURL !== "" ? this.leaderURL : this.endpoints[this.preferred % this.endpoints.length];
  }

  /**
   * Sends c, retrying after failures that leave it safe to repeat, and returns the
   * decoded answer. state.retried tells whether an earlier attempt may have reached a
   * node.
   */
  private async call<T>(c: Call, opts: CallOptions = {}, state = { retried: false }): Promise<T> {
    const body = c.body === undefined ? undefined : JSON.stringify(c.body);
    const budget = opts.budget;
    // An attempt that may have been applied (outcome_unknown): the call ends so, however
    // the last attempt failed (Go's do).
    let unknown: ApiError | undefined;
    const final = (err: unknown): unknown => {
      if (unknown === undefined || (err instanceof ApiError && err.code === "outcome_unknown")) return err;
      return new ApiError("outcome_unknown", `${unknown.message} (the last attempt: ${err instanceof Error ? err.message : String(err)})`,
        { status: unknown.status, cause: err });
    };
    for (let attempt = 0; ; attempt++) {
      if (attempt > 0) {
        let delay = backoff(attempt, this.settings.backoffMinMs, this.settings.backoffMaxMs);
        // The last attempt goes out when the budget ends, not a backoff before it.
        if (budget !== undefined) {
          const limit = budget.connectWaitMs !== undefined && budget.answered !== true ? Math.min(budget.limitMs, budget.connectWaitMs) : budget.limitMs;
          delay = Math.min(delay, Math.max(limit - budget.spentMs, 0));
        }
        await sleep(delay, opts.signal);
        if (budget !== undefined) budget.spentMs += delay;
      }
      const base = this.target();
      const start = Date.now();
      try {
        return (await this.attempt(base, c, body, opts)) as T;
      } catch (err) {
        if (opts.signal?.aborted) throw abortReason(opts.signal);
        if (!isRetryable(err)) throw err;
        state.retried = true;
        if (err instanceof ApiError && err.code === "outcome_unknown") unknown = err;
        // An answer (idemkv's error, a proxy's page) says the address is reachable;
        // only one that gave none (status 0) is not followed again for a while.
        this.demote(base, err instanceof ApiError && err.status === 0);
        let exhausted: boolean;
        if (budget !== undefined) {
          // A long-poll may take its whole wait; only the time past it is the store's.
          budget.spentMs += Math.max(Date.now() - start - (c.waitMs ?? 0), 0);
          exhausted = budget.spentMs >= budget.limitMs;
          if (!refused(err)) budget.answered = true;
          if (budget.connectWaitMs !== undefined && budget.answered !== true && budget.spentMs >= budget.connectWaitMs) {
            throw new ApiError("unavailable",
              `nobody listens: every endpoint refused the connection for ${Math.round(budget.spentMs)} ms (${attempt + 1} attempts; ` +
                `last: ${err instanceof Error ? err.message : String(err)}); is idemkv running at the configured endpoints?`, { status: 0, cause: err });
          }
        } else {
          exhausted = attempt + 1 >= this.settings.maxAttempts;
        }
        if (exhausted) throw final(err);
      }
    }
  }

  /** One HTTP attempt of c, under a span of its own when the client has a tracer. */
  private async attempt(base: string, c: Call, body: string | undefined, opts: CallOptions): Promise<unknown> {
    let path = c.path;
    const qs = c.query?.toString() ?? "";
    if (qs !== "") path += "?" + qs;
    let timeout = this.settings.timeoutMs;
    if (opts.budget !== undefined) {
      // Within a budget, one hung attempt must not outlast it by much.
      timeout = Math.min(timeout, Math.max(opts.budget.limitMs - opts.budget.spentMs, 50));
    }
    timeout += c.waitMs ?? 0;
    const headers: { [name: string]: string } = { Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (this.token !== undefined) headers.Authorization = `Bearer ${this.token}`;
    const span = this.tracer?.startSpan(`${c.method} ${c.route}`, {
      kind: SPAN_KIND_CLIENT,
      attributes: {
        "http.request.method": c.method,
        "url.full": base + path,
        "server.address": base.replace(/^https?:\/\//, ""),
        ...c.attrs?.(),
      },
    });
    // The node continues the trace from here: its span of this request is a child of this one.
    if (span !== undefined) Object.assign(headers, traceHeaders(span));
    try {
      const res = await this.exchange(base, c, path, headers, body, opts, timeout);
      span?.setAttribute("http.response.status_code", res.status);
      if (res.leader !== null && res.leader !== "") this.setLeader(res.leader);
      if (res.status >= 200 && res.status < 300) {
        try {
          return JSON.parse(res.body);
        } catch (err) {
          // A body cut short is a transport failure like any other, after the server
          // answered: a write it answered 2xx took effect.
          if (c.method !== "GET") {
            throw new ApiError("outcome_unknown", `idemkv: ${c.method} ${base}${c.path}: unreadable answer: it was applied`, { status: res.status, cause: err });
          }
          throw new ApiError("unavailable", `idemkv: ${c.method} ${base}${c.path}: unreadable answer`, { status: res.status, cause: err });
        }
      }
      throw decodeError(res.status, res.body, c.method !== "GET");
    } catch (err) {
      if (span !== undefined) failSpan(span, err);
      throw err;
    } finally {
      span?.end();
    }
  }

  /**
   * Sends one request. A failure to get an answer is an ApiError outcome_unknown for a
   * write that may have been sent, unavailable for a read or a write certainly not sent.
   */
  private async exchange(base: string, c: Call, path: string, headers: { [name: string]: string }, body: string | undefined,
    opts: CallOptions, timeout: number): Promise<HttpResponse> {
    const link = linkedController([opts.signal], timeout, () => new DOMException(`no answer in ${timeout} ms`, "TimeoutError"));
    try {
      let send = this.send;
      if (this.viaFetch && DOT_SEGMENT.test(c.path)) {
        this.raw ??= nodeSend();
        send = this.raw.send;
      }
      return await send({ method: c.method, base, path, headers, body, signal: link.signal });
    } catch (err) {
      if (opts.signal?.aborted) throw abortReason(opts.signal);
      // Nothing came back. Every idemkv request is safe to repeat (reserve by
      // attempt_id, the rest by fence), so either way this is "try again"; but a write
      // the server received may have been applied, and unavailable says it certainly was
      // not (docs/protocol.md, section 2): a denial that took effect was reported as not
      // taken. fetch does not say whether the request was written, so a write is taken
      // as sent unless the connection itself failed (refused, no such host).
      const why = link.signal.aborted ? `no answer in ${timeout} ms` : describe(err);
      if (c.method !== "GET" && !notSent(err)) {
        throw new ApiError("outcome_unknown", `idemkv: ${c.method} ${base}${c.path}: sent, and no answer came back: it may have been applied: ${why}`,
          { status: 0, cause: err });
      }
      throw new ApiError("unavailable", `idemkv: ${c.method} ${base}${c.path}: ${why}`, { status: 0, cause: err });
    } finally {
      link.dispose();
    }
  }

  // ---- the endpoints ----

  /** Asks for the right to run an effect. A request without attempt_id gets a fresh one. */
  async reserve(req: ReserveRequest, opts?: CallOptions): Promise<ReserveResult> {
    const r = req.attempt_id === undefined ? { ...req, attempt_id: newAttemptId() } : req;
    return this.call<ReserveResult>({
      method: "POST", route: "/v1/reserve", path: "/v1/reserve", body: r,
      attrs: () => ({ ...keyAttrs(r.tenant, r.idempotency_key), [ATTR.TOOL_NAME]: r.tool, [ATTR.ATTEMPT_ID]: r.attempt_id ?? "" }),
    }, opts);
  }

  /** Stores the receipt of the attempt holding req.fence. A retried commit gets the stored outcome. */
  async commit(req: CommitRequest, opts?: CallOptions): Promise<Receipt> {
    return this.call<Receipt>({ method: "POST", route: "/v1/commit", path: "/v1/commit", body: req, attrs: () => fencedAttrs(req) }, opts);
  }

  /** Stores a permanent failure for the attempt holding req.fence. */
  async fail(req: FailRequest, opts?: CallOptions): Promise<IdemkvRecord> {
    return this.call<IdemkvRecord>({ method: "POST", route: "/v1/fail", path: "/v1/fail", body: req, attrs: () => fencedAttrs(req) }, opts);
  }

  /**
   * Gives the key back. When an earlier attempt of this call may have reached a node,
   * not_found means that attempt released it, and is reported as released.
   */
  async release(req: ReleaseRequest, opts?: CallOptions): Promise<ReleaseResult> {
    const state = { retried: false };
    try {
      return await this.call<ReleaseResult>({ method: "POST", route: "/v1/release", path: "/v1/release", body: req, attrs: () => fencedAttrs(req) }, opts, state);
    } catch (err) {
      if (err instanceof ApiError && err.code === "not_found" && state.retried) return { released: true };
      throw err;
    }
  }

  /** Extends the lease of the attempt holding req.fence. */
  async heartbeat(req: HeartbeatRequest, opts?: CallOptions): Promise<IdemkvRecord> {
    return this.call<IdemkvRecord>({ method: "POST", route: "/v1/heartbeat", path: "/v1/heartbeat", body: req, attrs: () => fencedAttrs(req) }, opts);
  }

  /** Marks a pending record in doubt; only the holder of its current fence may. */
  async doubt(req: DoubtRequest, opts?: CallOptions): Promise<IdemkvRecord> {
    return this.call<IdemkvRecord>({ method: "POST", route: "/v1/doubt", path: "/v1/doubt", body: req, attrs: () => fencedAttrs(req) }, opts);
  }

  /**
   * Settles an in-doubt record without a fence: outcome "committed" stores the receipt
   * (answer: the receipt), "not_executed" releases the key (answer: {released: true}).
   */
  async resolve(req: ResolveRequest, opts?: CallOptions): Promise<Receipt | ReleaseResult> {
    return this.call<Receipt | ReleaseResult>({ method: "POST", route: "/v1/resolve", path: "/v1/resolve", body: req, attrs: () => keyAttrs(req.tenant, req.idempotency_key) }, opts);
  }

  /**
   * Reads a record; with waitMs it long-polls until the record is not pending (or the
   * wait ends). An absent record throws ApiError with code not_found.
   */
  /**
   * What a release (or a resolve as not executed) left of a key: its tombstone, with the
   * history that event ended; undefined when the key holds a record or nothing is left.
   */
  async released(tenant: string, key: string, options: Omit<GetOptions, "history" | "waitMs"> & CallOptions = {}): Promise<Tombstone | undefined> {
    try {
      await this.get(tenant, key, { ...options, history: true });
    } catch (err) {
      if (err instanceof ApiError && err.code === "not_found") return err.details.released;
      throw err;
    }
    return undefined;
  }

  async get(tenant: string, key: string, options: GetOptions & CallOptions = {}): Promise<IdemkvRecord> {
    const q = new URLSearchParams();
    if (options.waitMs !== undefined && options.waitMs > 0) q.set("wait_ms", String(Math.round(options.waitMs)));
    if (options.consistency !== undefined) q.set("consistency", options.consistency);
    if (options.history === true) q.set("history", "true");
    const c: Call = {
      method: "GET", route: "/v1/records/{tenant}/{key}", path: `/v1/records/${segment(tenant)}/${segment(key)}`, query: q,
      attrs: () => keyAttrs(tenant, key),
    };
    if (options.waitMs !== undefined && options.waitMs > 0) c.waitMs = options.waitMs;
    return this.call<IdemkvRecord>(c, options);
  }

  /** One page of a tenant's records, in key order; pass .next as after for the next one. */
  async list(tenant: string, options: ListOptions & CallOptions = {}): Promise<ListResult> {
    const q = new URLSearchParams();
    if (options.prefix !== undefined) q.set("prefix", options.prefix);
    if (options.status !== undefined) q.set("status", options.status);
    if (options.inDoubt) q.set("in_doubt", "true");
    if (options.limit !== undefined) q.set("limit", String(options.limit));
    if (options.after !== undefined) q.set("after", options.after);
    if (options.consistency !== undefined) q.set("consistency", options.consistency);
    return this.call<ListResult>({
      method: "GET", route: "/v1/records/{tenant}", path: `/v1/records/${segment(tenant)}`, query: q,
      attrs: () => ({ [ATTR.TENANT]: tenant }),
    }, options);
  }

  /** The cluster as the answering node sees it. */
  async cluster(opts?: CallOptions): Promise<ClusterInfo> {
    return this.call<ClusterInfo>({ method: "GET", route: "/v1/cluster", path: "/v1/cluster" }, opts);
  }

  // ---- approvals (docs/protocol.md section 7) ----

  /**
   * One page of a tenant's waiting approvals, oldest first: records with their approval
   * (id, summary, requested_at, expires_at), tool, effect and effect_fingerprint. Pass
   * .next as after for the next page.
   */
  async approvals(tenant: string, options: ApprovalsOptions & CallOptions = {}): Promise<ApprovalsResult> {
    const q = new URLSearchParams({ tenant });
    if (options.limit !== undefined) q.set("limit", String(options.limit));
    if (options.after !== undefined) q.set("after", options.after);
    if (options.consistency !== undefined) q.set("consistency", options.consistency);
    const page = await this.call<ApprovalsResult>({
      method: "GET", route: "/v1/approvals", path: "/v1/approvals", query: q, attrs: () => ({ [ATTR.TENANT]: tenant }),
    }, options);
    return { ...page, approvals: page.approvals ?? [] };
  }

  /** Every waiting approval of the tenant, oldest first, a page at a time. */
  async *allApprovals(tenant: string, options: { pageSize?: number } & CallOptions = {}): AsyncGenerator<IdemkvRecord, void, undefined> {
    let after: string | undefined;
    for (;;) {
      const o: ApprovalsOptions & CallOptions = { ...options };
      if (options.pageSize !== undefined) o.limit = options.pageSize;
      if (after !== undefined) o.after = after;
      const page = await this.approvals(tenant, o);
      yield* page.approvals;
      if (page.next === undefined || page.next === "") return;
      after = page.next;
    }
  }

  /**
   * Approves or denies the request a key waits for; it takes an approver (or admin) token.
   * The answer is the record. A request that was decided, consumed or lapsed throws
   * ApprovalNotPendingError; another approval id or fingerprint ApprovalMismatchError. A
   * decision retried after its answer was lost meets not_pending, its own doing: when the
   * record holds exactly this decision (this approval id, verdict and reason, and an
   * approver the server records for this name under a token: approverNamed) it is
   * reported as success.
   */
  async decideApproval(req: DecideApprovalRequest, opts?: CallOptions): Promise<IdemkvRecord> {
    const { tenant, idempotency_key: key, ...body } = req;
    const state = { retried: false };
    try {
      return await this.call<IdemkvRecord>({
        method: "POST", route: "/v1/approvals/{tenant}/{key}", path: `/v1/approvals/${segment(tenant)}/${segment(key)}`, body,
        attrs: () => keyAttrs(tenant, key),
      }, opts, state);
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      if (err.code === "not_pending" && state.retried) {
        const rec = await this.get(tenant, key, opts).catch(() => undefined);
        const a = rec?.approval;
        if (rec !== undefined && a !== undefined && a.id === req.approval_id && approverNamed(a.approver ?? "", req.approver) &&
          (a.reason ?? "") === (req.reason ?? "") && a.state === (req.decision === "deny" ? "denied" : "approved")) return rec;
      }
      const o = { status: err.status, cause: err, ...(err.field !== undefined ? { field: err.field } : {}) };
      if (err.code === "not_pending") throw new ApprovalNotPendingError(err.message, o);
      if (err.code === "fingerprint_mismatch") throw new ApprovalMismatchError(err.message, o);
      throw err;
    }
  }

  /** decideApproval with decision "approve". */
  async approve(req: Omit<DecideApprovalRequest, "decision">, opts?: CallOptions): Promise<IdemkvRecord> {
    return this.decideApproval({ ...req, decision: "approve" }, opts);
  }

  /** decideApproval with decision "deny": every retry of the key replays the denial. */
  async deny(req: Omit<DecideApprovalRequest, "decision">, opts?: CallOptions): Promise<IdemkvRecord> {
    return this.decideApproval({ ...req, decision: "deny" }, opts);
  }

  /** Makes every reserve of a tenant's tool require approval (admin token); ttl in ms. The answer is the tenant's rules. */
  async setApprovalRule(req: ApprovalRule & { remove?: boolean }, opts?: CallOptions): Promise<{ rules: ApprovalRule[] }> {
    return this.call<{ rules: ApprovalRule[] }>({ method: "POST", route: "/v1/approval-rules", path: "/v1/approval-rules", body: req }, opts);
  }

  /** The tenant's approval rules. */
  async approvalRules(tenant: string, opts?: CallOptions): Promise<{ rules: ApprovalRule[] }> {
    return this.call<{ rules: ApprovalRule[] }>({
      method: "GET", route: "/v1/approval-rules", path: "/v1/approval-rules", query: new URLSearchParams({ tenant }),
    }, opts);
  }
}

/** The longest approver the server records, in UTF-8 bytes (Go's idemkv.MaxApproverLen). */
const MAX_APPROVER_LEN = 128;
const APPROVER_VIA = " via ";
const utf8 = new TextEncoder();

/**
 * Whether recorded, the approver a decision recorded, is what the server makes of a body
 * naming named under some token (Go's idemkv.ApproverNamed, exactly): named alone without
 * authentication; the token's identity alone ("ana (approver)") when the body names the
 * token's holder; else "<named> via <token>", named clipped to fit 128 bytes. How a client
 * that lost a decision's answer and met not_pending on its retry knows the decision on
 * record is its own; it does not know its token's name, so any token matches, and the
 * approval id, verdict and reason it compares besides make the decision its own.
 */
export function approverNamed(recorded: string, named: string): boolean {
  if (recorded === named || recorded.startsWith(named + " (")) return true;
  // The name before " via " may have been clipped to make room for the token, and then
  // the whole is within a rune (4 bytes) of the limit.
  const nearLimit = utf8.encode(recorded).length > MAX_APPROVER_LEN - 4;
  for (let i = 0; ;) {
    const j = recorded.indexOf(APPROVER_VIA, i);
    if (j < 0) return false;
    const left = recorded.slice(0, j);
    if (left === named || (left !== "" && nearLimit && named.startsWith(left))) return true;
    i = j + APPROVER_VIA.length;
  }
}

/** Whether a failed attempt means nobody listens at the address (a refused connection, nothing answered). */
function refused(err: unknown): boolean {
  for (let e: unknown = err, depth = 0; e !== undefined && e !== null && depth < 8; depth++) {
    const x = e as { code?: unknown; errors?: unknown[]; cause?: unknown };
    if (x.code === "ECONNREFUSED") return true;
    // Node's fetch tries every address of a name and reports them together.
    if (Array.isArray(x.errors) && x.errors.length > 0 && x.errors.every(refused)) return true;
    e = x.cause;
  }
  return false;
}

/**
 * Errors of connecting, which come before a byte of the request is sent: a refused
 * connection, a name that does not resolve, a connect timeout. Anything else (a reset, a
 * closed socket, a timeout waiting for the answer) may come after the request was sent.
 */
const NOT_SENT = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "EAI_FAIL", "EAI_NONAME", "EAI_NODATA", "EADDRNOTAVAIL", "UND_ERR_CONNECT_TIMEOUT"]);

/** Whether a failed attempt certainly never sent its request (see NOT_SENT). */
function notSent(err: unknown): boolean {
  for (let e: unknown = err, depth = 0; e !== undefined && e !== null && depth < 8; depth++) {
    const x = e as { code?: unknown; errors?: unknown[]; cause?: unknown };
    if (typeof x.code === "string" && NOT_SENT.has(x.code)) return true;
    // Node's fetch tries every address of a name and reports them together.
    if (Array.isArray(x.errors) && x.errors.length > 0 && x.errors.every(notSent)) return true;
    e = x.cause;
  }
  return false;
}

function keyAttrs(tenant: string, key: string): Attributes {
  return { [ATTR.TENANT]: tenant, [ATTR.IDEMPOTENCY_KEY]: key };
}

function fencedAttrs(req: { tenant: string; idempotency_key: string; fence: number }): Attributes {
  return { ...keyAttrs(req.tenant, req.idempotency_key), [ATTR.FENCE]: req.fence };
}

function describe(err: unknown): string {
  if (err instanceof Error) {
    const cause = (err as { cause?: unknown }).cause;
    const code = cause instanceof Error && (cause as { code?: unknown }).code;
    return typeof code === "string" ? `${err.message} (${code})` : err.message;
  }
  return String(err);
}

/** Turns an error answer into the ApiError the server meant. */
function decodeError(status: number, text: string, write: boolean): ApiError {
  try {
    const body = JSON.parse(text) as { error?: { code?: string; message?: string; field?: string; details?: unknown } };
    const e = body.error;
    if (e !== undefined && typeof e.code === "string" && e.code !== "") {
      const code = (e.code in WIRE_CODES ? e.code : "internal") as WireCode;
      const opts: { status: number; field?: string; details?: ApiErrorDetails } = { status };
      if (e.field !== undefined && e.field !== "") opts.field = e.field;
      if (typeof e.details === "object" && e.details !== null && !Array.isArray(e.details)) opts.details = e.details as ApiErrorDetails;
      return new ApiError(code, `idemkv: ${e.code}: ${e.message ?? ""}${e.field ? ` (field ${e.field})` : ""}`, opts);
    }
  } catch {
    // not idemkv's answer
  }
  // A proxy or load balancer in between: a gateway that could not reach a node means
  // "try another"; anything else is not ours to read. A 502 (the node's answer broke
  // off) or a 504 (no answer in time) may come after the proxy forwarded a write, which
  // may then have been applied (the Go client's decodeError).
  let code: WireCode = status === 502 || status === 503 || status === 504 ? "unavailable" : "internal";
  if (write && (status === 502 || status === 504)) code = "outcome_unknown";
  return new ApiError(code, `idemkv: HTTP ${status}: ${text.trim().slice(0, 200)}`, { status });
}
