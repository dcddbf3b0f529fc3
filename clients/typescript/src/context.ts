// What a run puts around its tool calls, in AsyncLocalStorage so that it follows the
// async calls the run makes and never leaks into a concurrent run: the operation they
// belong to (the key of a wrapped tool that names none), and the switch that turns
// idempotent() into a pass-through for a runtime's unit tests.

import { AsyncLocalStorage } from "node:async_hooks";

/** The business operation tool calls run for: a run's approval, a tool-call id. */
export interface Operation {
  /** "run_9:approval_17"; a wrapped tool's key is "<id>:<tool>". */
  id: string;
  /** StoreUnavailableError.attemptId, to retry as the same attempt. */
  attemptId?: string;
}

const operations = new AsyncLocalStorage<Operation>();
const passthroughs = new AsyncLocalStorage<boolean>();
let passthroughDefault = false;

/**
 * Runs fn for one operation: a tool wrapped by idempotent() without a key option takes
 * "<id>:<tool>" as its key inside fn (and everything fn awaits).
 *
 *   await operation(`${runId}:${toolCallId}`, () => createTicket({ title: "Outage X" }));
 */
export function operation<T>(id: string, fn: () => T, options: { attemptId?: string } = {}): T {
  if (typeof id !== "string" || id === "") throw new TypeError("idemkv: operation needs a non-empty id (a run, approval or tool-call id)");
  const op: Operation = { id };
  if (options.attemptId !== undefined) op.attemptId = options.attemptId;
  return operations.run(op, fn);
}

/** The operation the calling code runs in, or undefined. */
export function currentOperation(): Operation | undefined {
  return operations.getStore();
}

/** Runs fn with every idempotent() function calling its tool directly: no store, no key, no fingerprint. */
export function passthrough<T>(fn: () => T, on = true): T {
  return passthroughs.run(on, fn);
}

/** Turns the pass-through on or off for every context that did not choose (a test suite's setup). */
export function setPassthrough(on: boolean): void {
  passthroughDefault = on;
}

export function isPassthrough(): boolean {
  return passthroughs.getStore() ?? passthroughDefault;
}
