// What a tool call is, as run and idempotent take it: the tool, its probe, the op that
// names its key and effect, and the outcome a call resolves with. The loop's modules
// (run, attempt, wait, lease, execute, indoubt, outcome) share these; the package
// entry point exports them.

import { AsyncLocalStorage } from "node:async_hooks";
import type { ApprovalRequirement } from "./approval.js";
import type { Client } from "./client.js";
import type { Decision, Receipt } from "./types.js";

/**
 * What a retry of a tool may do to the world. The short names are the ones the Python
 * client takes; the long ones are Go's.
 *   - read_only: no reservation; the call runs directly.
 *   - idempotent (idempotent_mutation): may run twice with the same effect (a PUT by
 *     id); a recovered attempt runs it again.
 *   - non_idempotent (non_idempotent_mutation, the default): must not run twice; a
 *     recovered attempt asks the probe, and without one the key is in doubt.
 */
export type SideEffect = "read_only" | "idempotent" | "non_idempotent" | "idempotent_mutation" | "non_idempotent_mutation";

/** What the loop needs of idemkv: a Client (in a runtime's unit tests, MemoryStore.client()). */
export type Store = Pick<Client, "reserve" | "commit" | "fail" | "release" | "heartbeat" | "doubt" | "resolve" | "get" | "settings" | "tracer">;

/** The downstream system's receipt, as a tool or a probe reports it. */
export interface ToolResult {
  remoteSystem: string;
  remoteId: string;
  remoteUrl?: string;
  /** Stored as JSON with the receipt and replayed with it. */
  result?: unknown;
}

/** What a running tool or probe may know about its call. */
export interface ToolContext {
  /** Aborts when the lease went to a newer attempt (or the caller aborted): stop soon. */
  signal: AbortSignal;
  tenant: string;
  key: string;
  tool: string;
  decision: Decision;
  /** The fence this attempt holds; 0 when it holds none (read-only, unguarded, in-doubt probe). */
  fence: number;
}

export type ToolFn = (ctx: ToolContext) => Promise<ToolResult>;
/** Looks the effect up downstream; the receipt when it happened, null when it certainly did not. */
export type ProbeFn = (ctx: ToolContext) => Promise<ToolResult | null | undefined>;

/** One tool call. */
export interface Op {
  tenant: string;
  /** Names the business operation: every retry of it, by any worker, carries the same key. */
  key: string;
  tool: string;
  /** Who runs this attempt; not part of the identity. */
  actor?: string;
  sideEffect?: SideEffect;
  /** The fields that define the side effect; fingerprinted here (RFC 8785 + SHA-256) after drop. */
  effect?: unknown;
  /**
   * Instead of effect: the effect as the JSON text it arrived in (a model's tool-call
   * arguments), fingerprinted as written (fingerprintJSON), never through JSON.parse, which
   * keeps the last of duplicate members and rounds numbers to doubles. The text must be
   * I-JSON: duplicate members, invalid UTF-8 and numbers no double holds exactly are
   * refused (NotExecutedError), as the server refuses them; 2^53 or 1e21 written in the
   * text are kept, where a decoded value's are refused. Go's json.RawMessage effect,
   * Python's RawJSON.
   */
  effectJSON?: string | Uint8Array;
  drop?: string[];
  /** Instead of effect: a fingerprint computed elsewhere. */
  fingerprint?: string;
  /** How long the record and its receipt are kept, in ms (server default 24 h). */
  ttl?: number;
  /** This call's lease in ms (default: the client's leaseTtl). */
  leaseTtl?: number;
  probe?: ProbeFn;
  /**
   * Names this attempt to the server (Go's Op.AttemptID); default: a fresh one. Pass
   * StoreUnavailableError.attemptId to retry a call whose reserve may have landed
   * unanswered: the server recognises the same attempt instead of a stranger that waits
   * out the phantom lease and then finds the key in doubt.
   */
  attemptId?: string;
  /**
   * Errors of the tool after which the effect certainly did not happen: the key is released
   * (as notExecuted(err)). One that throws leaves the record pending (OutcomeUnknownError,
   * what it threw the cause), as does permanentOn.
   */
  notExecutedOn?: (err: unknown) => boolean;
  /** Errors of the tool that will not go away on retry: stored and replayed (as permanent(err)). */
  permanentOn?: (err: unknown) => boolean;
  /** What this tool asks of approvals (docs/protocol.md section 7); its summary here is the text. */
  approval?: ApprovalRequirement<never[]>;
}

export interface RunOptions {
  /**
   * Ends the call: before the tool runs, with NotExecutedError, or StoreUnavailableError
   * naming the attempt to retry as when a reserve was in flight (it may hold the key);
   * during the wait for an approval, with ApprovalPendingError (the request still waits);
   * while the tool runs, the tool's signal aborts, but its lease is kept until it returns.
   */
  signal?: AbortSignal;
}

/** The committed outcome of a call. */
export interface Outcome {
  /** The reserve decision that led here: execute, recover or replay. */
  decision: Decision;
  /** The tool did not run; the receipt is the one stored earlier. */
  replayed: boolean;
  /** A recovered attempt found the effect through the probe and stored it, without running the tool. */
  probed: boolean;
  /** Nothing was recorded: a read-only tool, or an unguarded run while idemkv was unreachable. */
  unrecorded: boolean;
  /** The unguarded run: idemkv could not be reached and onStoreUnavailable let an idempotent tool run (Go's Outcome.Unguarded). */
  unguarded: boolean;
  /**
   * The stored receipt holds the note of OMITTED_RESULT_KEY instead of the tool's result,
   * which was too large for the server to store (Go's Outcome.ResultOmitted).
   */
  resultOmitted: boolean;
  receipt: Receipt;
  fingerprint: string;
  fence: number;
  /** How many attempts were granted ownership of the key. */
  attempts: number;
}

// Not exported: its type would put node:async_hooks into the declarations, which a
// consuming project without @types/node cannot resolve.
const storage = new AsyncLocalStorage<ToolContext>();

/** The context of the tool call running now (inside a function that idempotent wraps), or undefined. */
export function toolContext(): ToolContext | undefined {
  return storage.getStore();
}

/** Runs f, a tool or probe, with ctx as its toolContext(). */
export function withToolContext<T>(ctx: ToolContext, f: () => T): T {
  return storage.run(ctx, f);
}

/** A side effect's class, by the short name the loop branches on. */
export type ToolClass = "read_only" | "idempotent" | "non_idempotent";

/** The classes by their names on the wire and in spans (Go's and Python's). */
export const CLASS_NAMES = { read_only: "read_only", idempotent: "idempotent_mutation", non_idempotent: "non_idempotent_mutation" } as const;

/** The class of a sideEffect, long name or short; an unknown one is a TypeError. */
export function classOf(s: SideEffect | undefined): ToolClass {
  switch (s) {
    case undefined:
    case "non_idempotent":
    case "non_idempotent_mutation":
      return "non_idempotent";
    case "idempotent":
    case "idempotent_mutation":
      return "idempotent";
    case "read_only":
      return "read_only";
  }
  throw new TypeError(`idemkv: unknown sideEffect ${JSON.stringify(s)}`);
}
