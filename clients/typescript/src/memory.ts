// An in-memory idemkv for a runtime's unit tests: no node, the same decisions.
//
//   const store = new MemoryStore();
//   const client = store.client({ leaseTtl: 5000 });      // a Client whose fetch the store answers
//   const createTicketOnce = idempotent(createTicket, { client, tenant: "t42", tool: "create_ticket", key: "approvalId" });
//
// The store answers the HTTP API in this process, through the Client's fetch option, so
// the client, the loop and their errors are the real ones; only the node is not. Its
// decisions are the server's decision table (docs/protocol.md section 1): the scenarios
// in testdata/decisions, which the Go tests hold to the server's own decision functions,
// hold it to the same answers. The clock is injectable (clock, advance) so that tests of
// leases and TTLs need not wait. No tokens, no history, no payload limit unless given
// one: it is for tests, not a store. To call the wrapped functions without any store,
// see passthrough().

import { Client, type ClientOptions } from "./client.js";
import { WIRE_CODES, type WireCode } from "./errors.js";

interface Rec {
  tenant: string;
  idempotency_key: string;
  effect_fingerprint: string;
  tool: string;
  actor?: string;
  status: "pending" | "committed" | "failed";
  fence: number;
  attempt_id: string;
  attempts: number;
  created_at: number;
  updated_at: number;
  lease_expires_at: number;
  expires_at: number;
  receipt?: { remote_system: string; remote_id: string; remote_url?: string; result?: unknown; committed_at: number };
  error?: unknown;
  in_doubt?: boolean;
  in_doubt_since?: number;
}

type Body = { [name: string]: unknown };

class Refusal extends Error {
  constructor(readonly code: WireCode, message: string) {
    super(message);
  }
}

export interface MemoryStoreOptions {
  /** Milliseconds since the epoch; default Date.now. advance() adds to it. */
  clock?: () => number;
  /** Refuse a larger result (or error details) with payload_too_large, as a server does. Default: no limit. */
  maxPayloadBytes?: number;
}

const stamp = (ms: number) => new Date(ms).toISOString();
const terminal = (r: Rec) => r.status === "committed" || r.status === "failed";

/** The records of one process, decided as the server decides them (see the file's comment). */
export class MemoryStore {
  /** The routes called, in order, for assertions ("POST /v1/reserve"). */
  readonly calls: string[] = [];
  private readonly records = new Map<string, Rec>();
  private readonly clock: () => number;
  private readonly maxPayloadBytes: number | undefined;
  private offset = 0;
  /** The fence of the next grant: it only grows, as a Raft index does. */
  private index = 0;
  private waiters = new Set<() => void>();

  constructor(options: MemoryStoreOptions = {}) {
    this.clock = options.clock ?? Date.now;
    this.maxPayloadBytes = options.maxPayloadBytes;
  }

  now(): number {
    return this.clock() + this.offset;
  }

  /** Moves the store's clock on: leases and TTLs run out without waiting. */
  advance(ms: number): void {
    this.offset += ms;
    this.changed();
  }

  /** A Client whose calls this store answers. Options are Client's; endpoints and fetch are the store's. */
  client(options: Omit<ClientOptions, "endpoints" | "fetch" | "tls"> = {}): Client {
    return new Client({ ...options, endpoints: ["memory.invalid:7420"], fetch: this.fetch });
  }

  /** Every live record, as GET answers it. */
  list(): unknown[] {
    const now = this.now();
    return [...this.records.values()].filter((r) => r.expires_at > now).map((r) => this.wire(r));
  }

  /** The HTTP API, as fetch: what client() plugs in. */
  readonly fetch = async (input: string | URL | Request, init: RequestInit = {}): Promise<Response> => {
    const url = new URL(typeof input === "string" ? input : input instanceof URL ? input.href : input.url);
    const method = init.method ?? "GET";
    this.calls.push(`${method} ${url.pathname.startsWith("/v1/records/") ? "/v1/records/{tenant}/{key}" : url.pathname}`);
    try {
      const body: Body = typeof init.body === "string" && init.body !== "" ? JSON.parse(init.body) : {};
      const out = method === "GET" ? await this.get(url) : this.post(url.pathname, body);
      this.changed();
      return new Response(JSON.stringify(out), { status: 200, headers: { "content-type": "application/json" } });
    } catch (err) {
      if (!(err instanceof Refusal)) throw err;
      return new Response(JSON.stringify({ error: { code: err.code, message: err.message } }),
        { status: WIRE_CODES[err.code], headers: { "content-type": "application/json" } });
    }
  };

  private changed(): void {
    const w = this.waiters;
    this.waiters = new Set();
    for (const f of w) f();
  }

  private live(tenant: string, key: string, now: number): Rec | undefined {
    const r = this.records.get(JSON.stringify([tenant, key]));
    return r === undefined || r.expires_at <= now ? undefined : r;
  }

  private async get(url: URL): Promise<unknown> {
    const [, , , tenant, key] = url.pathname.split("/").map(decodeURIComponent);
    const end = Date.now() + Number(url.searchParams.get("wait_ms") ?? "0");
    for (;;) {
      const now = this.now();
      const r = this.live(tenant, key, now);
      if (r === undefined) throw new Refusal("not_found", `no record for ${JSON.stringify(key)}`);
      let left = end - Date.now();
      // The server ends a wait when the holder's lease runs out.
      if (!r.in_doubt && r.lease_expires_at !== 0) left = Math.min(left, r.lease_expires_at - now);
      if (r.status !== "pending" || left <= 0) return this.wire(r);
      await new Promise<void>((resolve) => {
        const t = setTimeout(() => {
          this.waiters.delete(done);
          resolve();
        }, left);
        const done = () => {
          clearTimeout(t);
          resolve();
        };
        this.waiters.add(done);
      });
    }
  }

  private post(path: string, b: Body): unknown {
    const now = this.now();
    switch (path) {
      case "/v1/reserve":
        return this.reserve(b, now);
      case "/v1/commit":
        return this.commit(b, now);
      case "/v1/fail":
        return this.fail(b, now);
      case "/v1/release":
        return this.release(b, now);
      case "/v1/heartbeat":
        return this.heartbeat(b, now);
      case "/v1/doubt":
        return this.doubt(b, now);
      case "/v1/resolve":
        return this.resolve(b, now);
    }
    throw new Refusal("invalid_argument", `the in-memory store does not serve POST ${path}`);
  }

  private owner(b: Body, now: number, checkFingerprint = true): Rec {
    const r = this.live(String(b.tenant), String(b.idempotency_key), now);
    if (r === undefined) throw new Refusal("not_found", "no live record for this key");
    if (checkFingerprint && b.effect_fingerprint !== r.effect_fingerprint) {
      throw new Refusal("fingerprint_mismatch", `the record holds ${r.effect_fingerprint}`);
    }
    if (b.fence !== r.fence) throw new Refusal("fenced", `fence ${String(b.fence)} is not the current fence ${r.fence}`);
    return r;
  }

  private checkPayload(v: unknown): void {
    if (this.maxPayloadBytes === undefined || v === undefined) return;
    const size = new TextEncoder().encode(JSON.stringify(v)).length;
    if (size > this.maxPayloadBytes) throw new Refusal("payload_too_large", `result is ${size} bytes; the limit is ${this.maxPayloadBytes}`);
  }

  private reserve(b: Body, now: number): unknown {
    if ((b.approval as { required?: unknown } | undefined)?.required === true) {
      // Refused rather than run unapproved: a unit test must not pass a tool that would
      // wait for a person against a node.
      throw new Refusal("invalid_argument", "the in-memory store does not model approvals (docs/protocol.md section 7); test a tool that requires approval against a node");
    }
    const tenant = String(b.tenant), key = String(b.idempotency_key), tool = String(b.tool);
    const fp = String(b.effect_fingerprint ?? ""), attempt = String(b.attempt_id ?? "");
    const lease = Number(b.lease_ttl_ms ?? 30_000), ttl = Number(b.ttl_ms ?? 86_400_000);
    const actor = typeof b.actor === "string" ? b.actor : undefined;
    this.index++;
    const r = this.live(tenant, key, now);
    if (r === undefined) {
      const rec: Rec = {
        tenant, idempotency_key: key, effect_fingerprint: fp, tool, status: "pending", fence: this.index, attempt_id: attempt,
        attempts: 1, created_at: now, updated_at: now, lease_expires_at: now + lease, expires_at: Math.max(now + ttl, now + lease),
      };
      if (actor !== undefined) rec.actor = actor;
      this.records.set(JSON.stringify([tenant, key]), rec);
      return this.granted("execute", rec);
    }
    if (r.tool !== tool || r.effect_fingerprint !== fp) {
      const conflict: Body = {
        status: "conflict", reason: "idempotency_key_reused_with_different_effect", existing_fingerprint: r.effect_fingerprint,
        received_fingerprint: fp,
      };
      if (r.tool !== tool) Object.assign(conflict, { reason: "idempotency_key_reused_with_different_tool", existing_tool: r.tool, received_tool: tool });
      if (r.status === "committed" && r.receipt !== undefined) conflict.existing_remote_id = r.receipt.remote_id;
      return { decision: "conflict", conflict, record: this.wire(r) };
    }
    if (terminal(r)) return { decision: "replay", receipt: this.outcome(r), record: this.wire(r) };
    if (r.in_doubt) return { decision: "recover", record: this.wire(r) };
    if (attempt !== "" && attempt === r.attempt_id) {
      r.updated_at = now;
      r.lease_expires_at = Math.max(r.lease_expires_at, now + lease);
      r.expires_at = Math.max(r.expires_at, now + ttl, r.lease_expires_at);
      return this.granted(r.attempts > 1 ? "recover" : "execute", r);
    }
    if (r.lease_expires_at > now) return { decision: "in_progress", lease_expires_at: stamp(r.lease_expires_at), record: this.wire(r) };
    Object.assign(r, { fence: this.index, attempt_id: attempt, attempts: r.attempts + 1, updated_at: now, lease_expires_at: now + lease });
    if (actor !== undefined) r.actor = actor;
    r.expires_at = Math.max(r.expires_at, now + ttl, r.lease_expires_at);
    return this.granted("recover", r);
  }

  private granted(decision: string, r: Rec): unknown {
    return { decision, fence: r.fence, attempt_id: r.attempt_id, lease_expires_at: stamp(r.lease_expires_at), record: this.wire(r) };
  }

  private settle(r: Rec, now: number, b: Body): void {
    this.checkPayload(b.result);
    r.status = "committed";
    r.updated_at = now;
    r.lease_expires_at = 0;
    delete r.in_doubt;
    delete r.in_doubt_since;
    r.receipt = { remote_system: String(b.remote_system), remote_id: String(b.remote_id), committed_at: now };
    if (typeof b.remote_url === "string") r.receipt.remote_url = b.remote_url;
    if (b.result !== undefined) r.receipt.result = b.result;
  }

  private commit(b: Body, now: number): unknown {
    const r = this.owner(b, now);
    if (!terminal(r)) this.settle(r, now, b);
    return this.outcome(r);
  }

  private fail(b: Body, now: number): unknown {
    const r = this.owner(b, now);
    if (!terminal(r)) {
      this.checkPayload((b.error as Body | undefined)?.details);
      Object.assign(r, { status: "failed", updated_at: now, lease_expires_at: 0, error: b.error });
      delete r.in_doubt;
      delete r.in_doubt_since;
    }
    return this.wire(r);
  }

  private release(b: Body, now: number): unknown {
    const r = this.owner(b, now);
    if (terminal(r)) throw new Refusal("not_pending", `the record is ${r.status}`);
    this.records.delete(JSON.stringify([r.tenant, r.idempotency_key]));
    return { released: true };
  }

  private heartbeat(b: Body, now: number): unknown {
    const r = this.owner(b, now, false);
    if (terminal(r) || r.in_doubt) throw new Refusal("not_pending", "the record is not held by a running attempt");
    r.updated_at = now;
    r.lease_expires_at = Math.max(r.lease_expires_at, now + Number(b.lease_ttl_ms ?? 30_000));
    r.expires_at = Math.max(r.expires_at, r.lease_expires_at);
    return this.wire(r);
  }

  private doubt(b: Body, now: number): unknown {
    const r = this.owner(b, now);
    if (terminal(r)) throw new Refusal("not_pending", `the record is ${r.status}`);
    if (!r.in_doubt) Object.assign(r, { in_doubt: true, in_doubt_since: now, updated_at: now, lease_expires_at: 0 });
    return this.wire(r);
  }

  private resolve(b: Body, now: number): unknown {
    const r = this.live(String(b.tenant), String(b.idempotency_key), now);
    if (r === undefined) throw new Refusal("not_found", "no live record for this key");
    if (b.effect_fingerprint !== r.effect_fingerprint) throw new Refusal("fingerprint_mismatch", `the record holds ${r.effect_fingerprint}`);
    if (terminal(r) || !r.in_doubt) throw new Refusal("not_pending", "only an in-doubt record can be resolved");
    if (b.outcome === "not_executed") {
      this.records.delete(JSON.stringify([r.tenant, r.idempotency_key]));
      return { released: true };
    }
    this.settle(r, now, b);
    return this.outcome(r);
  }

  private wire(r: Rec): Body {
    const out: Body = { ...r, created_at: stamp(r.created_at), updated_at: stamp(r.updated_at), expires_at: stamp(r.expires_at) };
    if (r.lease_expires_at !== 0) out.lease_expires_at = stamp(r.lease_expires_at);
    else delete out.lease_expires_at;
    if (r.in_doubt_since !== undefined) out.in_doubt_since = stamp(r.in_doubt_since);
    if (r.receipt !== undefined) out.receipt = { ...r.receipt, committed_at: stamp(r.receipt.committed_at) };
    return out;
  }

  private outcome(r: Rec): Body {
    const w = this.wire(r);
    const out: Body = { idempotency_key: r.idempotency_key, effect_fingerprint: r.effect_fingerprint, status: r.status };
    Object.assign(out, w.receipt ?? {});
    if (r.error !== undefined) out.error = r.error;
    return out;
  }
}
