// Real idemkv processes for the tests: the binary built from this repository (env
// IDEMKV_BIN, as the Go test that drives this suite sets it, or built here with go
// build), one node or a three-node cluster, each killable with SIGKILL.

import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, existsSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { fileURLToPath } from "node:url";
import { join, resolve } from "node:path";

/** The repository's root: this file runs from clients/typescript/<outDir>/test/. */
export const repoRoot = process.env.IDEMKV_REPO ?? resolve(join(fileURLToPath(import.meta.url), "..", "..", "..", "..", ".."));

const scratch = mkdtempSync(join(tmpdir(), "idemkv-ts-"));
process.on("exit", () => rmSync(scratch, { recursive: true, force: true }));

/** A fresh directory under this run's scratch directory. */
export function tempDir(name: string): string {
  return mkdtempSync(join(scratch, name + "-"));
}

let bin: string | undefined;

export function idemkvBin(): string {
  if (bin !== undefined) return bin;
  const fromEnv = process.env.IDEMKV_BIN;
  if (fromEnv !== undefined && fromEnv !== "") {
    bin = fromEnv;
  } else {
    bin = join(scratch, "idemkv");
    execFileSync("go", ["build", "-o", bin, "./cmd/idemkv"], { cwd: repoRoot, stdio: ["ignore", "inherit", "inherit"] });
  }
  if (!existsSync(bin)) throw new Error(`no idemkv binary at ${bin}`);
  return bin;
}

export function freePort(): Promise<number> {
  return new Promise((res) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const port = s.address().port;
      s.close(() => res(port));
    });
  });
}

/** Polls f until it returns without throwing, or throws its last error after ms. */
export async function eventually<T>(ms: number, what: string, f: () => Promise<T> | T): Promise<T> {
  const end = Date.now() + ms;
  let last: unknown;
  for (;;) {
    try {
      return await f();
    } catch (err) {
      last = err;
    }
    if (Date.now() > end) throw new Error(`${what}: not within ${ms} ms: ${last}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export class IdemkvNode {
  proc: ChildProcess | undefined;
  log = "";
  constructor(
    readonly id: string,
    readonly httpAddr: string,
    readonly raftAddr: string,
    readonly dataDir: string,
    readonly extraArgs: string[] = [],
    /** Added to this process's environment (OTEL_* for the node's own spans, say). */
    readonly env: Record<string, string> = {},
  ) {}

  static async create(id: string, extraArgs: string[] = [], env: Record<string, string> = {}): Promise<IdemkvNode> {
    return new IdemkvNode(id, `127.0.0.1:${await freePort()}`, `127.0.0.1:${await freePort()}`, tempDir(id), extraArgs, env);
  }

  start(join?: string): void {
    const args = ["serve", "--id", this.id, "--data-dir", this.dataDir, "--http-addr", this.httpAddr, "--raft-addr", this.raftAddr,
      "--heartbeat-timeout", "500ms", "--election-timeout", "500ms", "--leader-lease-timeout", "250ms", "--log-level", "warn",
      ...this.extraArgs];
    if (join !== undefined) args.push("--join", join);
    const p = spawn(idemkvBin(), args, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...this.env } });
    p.stdout?.setEncoding("utf8");
    p.stderr?.setEncoding("utf8");
    p.stdout?.on("data", (c) => (this.log += String(c)));
    p.stderr?.on("data", (c) => (this.log += String(c)));
    this.proc = p;
  }

  get alive(): boolean {
    return this.proc !== undefined && this.proc.exitCode === null && this.proc.signalCode === null;
  }

  /** SIGKILL, and wait until the process is gone. */
  async kill(): Promise<void> {
    const p = this.proc;
    if (p === undefined || !this.alive) return;
    const gone = new Promise<void>((r) => p.once("exit", () => r()));
    p.kill("SIGKILL");
    await gone;
  }

  async ready(ms = 30_000): Promise<void> {
    await eventually(ms, `${this.id} ready`, async () => {
      if (!this.alive) throw new Error(`${this.id} exited: ${this.log}`);
      const r = await fetch(`http://${this.httpAddr}/readyz`);
      if (r.status !== 200) throw new Error(`readyz ${r.status}`);
    });
  }
}

/** Every node the tests started, for killAll. */
export const started: IdemkvNode[] = [];

/** Kills every node the tests started (the `after` hook of each test file). */
export async function killAll(): Promise<void> {
  await Promise.all(started.map((n) => n.kill()));
}

export async function startNode(extraArgs: string[] = [], env: Record<string, string> = {}): Promise<IdemkvNode> {
  const n = await IdemkvNode.create("n1", extraArgs, env);
  started.push(n);
  n.start();
  await n.ready();
  return n;
}

/** Three nodes: n1 bootstraps, n2 and n3 join through it; resolves once all three are voters. */
export async function startCluster(): Promise<IdemkvNode[]> {
  const nodes = await Promise.all(["n1", "n2", "n3"].map((id) => IdemkvNode.create(id)));
  started.push(...nodes);
  nodes[0].start();
  await nodes[0].ready();
  nodes[1].start(nodes[0].httpAddr);
  nodes[2].start(nodes[0].httpAddr);
  await Promise.all(nodes.map((n) => n.ready()));
  await eventually(30_000, "three voters", async () => {
    const r = await fetch(`http://${nodes[0].httpAddr}/v1/cluster`);
    const c = (await r.json()) as { nodes: Array<{ suffrage: string }> };
    const voters = c.nodes.filter((x) => x.suffrage === "voter").length;
    if (voters !== 3) throw new Error(`${voters} voters`);
  });
  return nodes;
}
