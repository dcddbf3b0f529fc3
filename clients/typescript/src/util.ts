// Small helpers on time and signals, shared by the client and the tool-call loop.

import { randomBytes } from "node:crypto";

/** The reason a signal was aborted with, as an Error. */
export function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("This operation was aborted", "AbortError");
}

/** Resolves after ms, or rejects with the signal's reason when it aborts first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(abortReason(signal));
      return;
    }
    const onAbort = () => {
      clearTimeout(t);
      reject(abortReason(signal as AbortSignal));
    };
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, Math.max(0, ms));
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** A full-jitter exponential delay for the n-th retry (n >= 1), between lo and hi ms. */
export function backoff(n: number, lo: number, hi: number): number {
  const ceil = Math.min(hi, lo * 2 ** Math.min(n - 1, 30));
  if (ceil <= lo) return lo;
  return lo + Math.random() * (ceil - lo);
}

/**
 * A controller whose signal aborts when any of the given signals does, or after ms
 * (when given), with that signal's reason. dispose() detaches it from its parents; call
 * it when done, or long-lived parent signals collect listeners.
 */
export function linkedController(signals: Array<AbortSignal | undefined>, ms?: number, timeoutReason?: () => unknown) {
  const c = new AbortController();
  const cleanups: Array<() => void> = [];
  const dispose = () => {
    for (const f of cleanups) f();
    cleanups.length = 0;
  };
  for (const s of signals) {
    if (s === undefined) continue;
    if (s.aborted) {
      c.abort(abortReason(s));
      break;
    }
    const f = () => c.abort(abortReason(s));
    s.addEventListener("abort", f, { once: true });
    cleanups.push(() => s.removeEventListener("abort", f));
  }
  if (ms !== undefined && !c.signal.aborted) {
    const t = setTimeout(() => c.abort(timeoutReason ? timeoutReason() : new DOMException("timed out", "TimeoutError")), Math.max(0, ms));
    cleanups.push(() => clearTimeout(t));
  }
  return { controller: c, signal: c.signal, dispose };
}

/** A random attempt id, so that a reserve retried after a lost answer is one attempt. */
export function newAttemptId(): string {
  return "att_" + randomBytes(12).toString("hex");
}
