// The parts of Node's built-in modules that the client uses. Debian packages the
// TypeScript compiler but not @types/node, and the client must build from Debian's
// packages alone, so these few signatures are declared here (checked against Node 20's
// documentation). They are compile-time only: no public type of the client names them,
// so a program that has @types/node sees no clash.

declare module "node:crypto" {
  interface Hash {
    update(data: string | Uint8Array): Hash;
    digest(encoding: "hex"): string;
  }
  export function createHash(algorithm: "sha256"): Hash;
  export function randomBytes(size: number): Uint8Array & { toString(encoding: "hex"): string };
}

declare module "node:async_hooks" {
  export class AsyncLocalStorage<T> {
    getStore(): T | undefined;
    run<R>(store: T, callback: () => R): R;
  }
}

declare module "node:http" {
  export interface IncomingMessage {
    statusCode?: number;
    headers: Record<string, string | string[] | undefined>;
    on(event: "data", listener: (chunk: Uint8Array) => void): this;
    on(event: "end", listener: () => void): this;
    on(event: "error", listener: (err: Error) => void): this;
    destroy(error?: Error): this;
  }
  export interface ClientRequest {
    on(event: "error", listener: (err: Error) => void): this;
    end(body?: string): void;
  }
  export class Agent {
    constructor(options?: { keepAlive?: boolean });
    destroy(): void;
  }
  export interface RequestOptions {
    method?: string;
    hostname?: string;
    port?: string | number;
    path?: string;
    headers?: Record<string, string>;
    agent?: Agent;
    signal?: AbortSignal;
  }
  export function request(options: RequestOptions, callback: (res: IncomingMessage) => void): ClientRequest;
}

declare module "node:https" {
  import type { ClientRequest, IncomingMessage } from "node:http";
  export interface AgentOptions {
    keepAlive?: boolean;
    ca?: string | Uint8Array | Array<string | Uint8Array>;
    cert?: string | Uint8Array;
    key?: string | Uint8Array;
    passphrase?: string;
    servername?: string;
    rejectUnauthorized?: boolean;
  }
  export class Agent {
    constructor(options?: AgentOptions);
    destroy(): void;
  }
  export interface RequestOptions {
    method?: string;
    hostname?: string;
    port?: string | number;
    path?: string;
    headers?: Record<string, string>;
    agent?: Agent;
    signal?: AbortSignal;
  }
  export function request(options: RequestOptions, callback: (res: IncomingMessage) => void): ClientRequest;
}
