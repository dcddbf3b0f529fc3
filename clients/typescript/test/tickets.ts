// Test doubles shared by the loop tests: a fake ticket system and a worker process
// that is SIGKILLed while its tool runs.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync, writeFileSync, existsSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { idempotent, IdemkvError, type Client, type Outcome } from "../src/index.js";
import { tempDir, type IdemkvNode } from "./harness.js";

/** A fake ticket system: a file of "KEY ID TITLE" lines. */
export class Tickets {
  readonly file = join(tempDir("tickets"), "tickets.txt");
  calls = 0;
  constructor() {
    writeFileSync(this.file, "");
  }
  lines(key: string): string[] {
    return readFileSync(this.file, "utf8").split("\n").filter((l) => l.startsWith(key + " "));
  }
  create = async (a: { key: string; title: string }): Promise<{ id: string; title: string }> => {
    this.calls++;
    const id = `TCK-${this.calls}`;
    writeFileSync(this.file, readFileSync(this.file, "utf8") + `${a.key} ${id} ${a.title}\n`);
    return { id, title: a.title };
  };
  find = async (a: { key: string }): Promise<{ id: string; title: string } | null> => {
    const l = this.lines(a.key)[0];
    if (l === undefined) return null;
    const [, id, ...title] = l.split(" ");
    return { id, title: title.join(" ") };
  };
}

/** Starts a worker process on key, waits until its tool is running, and SIGKILLs it. */
export async function crashWorker(node: IdemkvNode, tenant: string, key: string, tickets: string, mode: "after" | "before"): Promise<void> {
  const worker = join(fileURLToPath(import.meta.url), "..", "worker.js");
  assert.ok(existsSync(worker));
  const p = spawn(process.execPath, [worker, node.httpAddr, tenant, key, tickets, mode], { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  p.stdout?.setEncoding("utf8");
  p.stderr?.setEncoding("utf8");
  p.stdout?.on("data", (c) => (out += String(c)));
  p.stderr?.on("data", (c) => (out += String(c)));
  const want = mode === "after" ? "EFFECT" : "STARTED";
  const end = Date.now() + 20_000;
  while (!out.includes(want)) {
    if (Date.now() > end || p.exitCode !== null) throw new Error(`worker: ${out}`);
    await new Promise((r) => setTimeout(r, 20));
  }
  const gone = new Promise<void>((r) => p.once("exit", () => r()));
  p.kill("SIGKILL");
  await gone;
}


/** Prints what a scenario ended with, for the test log. */
export function logOutcome(t: { diagnostic(m: string): void }, what: string, o: Outcome | unknown): void {
  if (o instanceof IdemkvError) {
    t.diagnostic(`${what}: ${o.name} kind=${o.kind} decision=${o.decision ?? "-"}: ${o.message}`);
  } else {
    const x = o as Outcome;
    t.diagnostic(`${what}: decision=${x.decision} replayed=${x.replayed} probed=${x.probed} fence=${x.fence} ` +
      `attempts=${x.attempts} remote_id=${x.receipt.remote_id}`);
  }
}

/** create_ticket on tk, wrapped: the one-line wrap of the README. */
export function wrapTickets(client: Client, tenant: string, tk: Tickets, extra: { probe?: boolean; onOutcome?: (o: Outcome) => void } = {}) {
  return idempotent(tk.create, {
    client, tenant, tool: "create_ticket", key: (a) => a.key, effect: (a) => ({ title: a.title }),
    receipt: (t) => ({ remoteSystem: "tickets", remoteId: t.id }),
    ...(extra.probe ? { probe: tk.find } : {}),
    ...(extra.onOutcome ? { onOutcome: extra.onOutcome } : {}),
  });
}

