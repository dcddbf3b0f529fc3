// The parts of Node's built-in modules that the tests use (see src/node.d.ts for why
// they are declared here).

declare module "node:test" {
  interface TestContext {
    skip(message?: string): void;
    diagnostic(message: string): void;
    test(name: string, fn: (t: TestContext) => void | Promise<void>): Promise<void>;
  }
  type TestFn = (t: TestContext) => void | Promise<void>;
  interface TestOptions {
    timeout?: number;
    skip?: boolean | string;
    concurrency?: number | boolean;
  }
  export function test(name: string, fn: TestFn): Promise<void>;
  export function test(name: string, options: TestOptions, fn: TestFn): Promise<void>;
  export function describe(name: string, fn: () => void): void;
  export function describe(name: string, options: TestOptions, fn: () => void): void;
  export function it(name: string, fn: TestFn): void;
  export function it(name: string, options: TestOptions, fn: TestFn): void;
  export function before(fn: () => void | Promise<void>, options?: { timeout?: number }): void;
  export function after(fn: () => void | Promise<void>, options?: { timeout?: number }): void;
}

declare module "node:assert/strict" {
  interface Assert {
    (value: unknown, message?: string): asserts value;
    ok(value: unknown, message?: string): asserts value;
    equal<T>(actual: unknown, expected: T, message?: string): asserts actual is T;
    notEqual(actual: unknown, expected: unknown, message?: string): void;
    deepEqual<T>(actual: unknown, expected: T, message?: string): asserts actual is T;
    match(value: string, re: RegExp, message?: string): void;
    throws(fn: () => unknown, expected?: RegExp | Function | object, message?: string): void;
    rejects(p: Promise<unknown> | (() => Promise<unknown>), expected?: RegExp | Function | object, message?: string): Promise<void>;
    fail(message?: string): never;
  }
  const assert: Assert;
  export default assert;
}

declare module "node:fs" {
  export function readFileSync(path: string): Uint8Array & { toString(encoding?: "utf8"): string };
  export function readFileSync(path: string, encoding: "utf8"): string;
  export function writeFileSync(path: string, data: string): void;
  export function existsSync(path: string): boolean;
  export function mkdtempSync(prefix: string): string;
  export function mkdirSync(path: string, options?: { recursive?: boolean }): void;
  export function rmSync(path: string, options?: { recursive?: boolean; force?: boolean }): void;
  export function appendFileSync(path: string, data: string): void;
}

declare module "node:path" {
  export function join(...parts: string[]): string;
  export function dirname(p: string): string;
  export function resolve(...parts: string[]): string;
}

declare module "node:os" {
  export function tmpdir(): string;
}

declare module "node:url" {
  export function fileURLToPath(url: string): string;
}

declare module "node:net" {
  interface AddressInfo {
    port: number;
  }
  interface Server {
    listen(port: number, host: string, cb: () => void): Server;
    address(): AddressInfo;
    close(cb?: () => void): void;
  }
  export function createServer(): Server;
}

declare module "node:child_process" {
  interface Readable {
    on(event: "data", listener: (chunk: Uint8Array) => void): this;
    setEncoding(enc: "utf8"): void;
  }
  interface ChildProcess {
    pid?: number;
    exitCode: number | null;
    signalCode: string | null;
    stdout: Readable | null;
    stderr: Readable | null;
    kill(signal?: string): boolean;
    on(event: "exit", listener: (code: number | null, signal: string | null) => void): this;
    once(event: "exit", listener: (code: number | null, signal: string | null) => void): this;
  }
  interface SpawnOptions {
    stdio?: Array<"ignore" | "pipe" | "inherit">;
    env?: Record<string, string | undefined>;
  }
  export function spawn(cmd: string, args: string[], options?: SpawnOptions): ChildProcess;
  export function execFileSync(cmd: string, args: string[], options?: { stdio?: Array<"ignore" | "pipe" | "inherit">; cwd?: string }): Uint8Array;
}

declare var process: {
  env: Record<string, string | undefined>;
  argv: string[];
  pid: number;
  exit(code?: number): never;
  exitCode: number | undefined;
  execPath: string;
  stdout: { write(s: string): boolean };
  on(event: string, listener: (...args: unknown[]) => void): void;
};
