// How one HTTP request goes out. Node's global fetch is the default; it cannot take a
// custom CA or a client certificate (that needs an undici Agent, which Node bundles but
// does not export), so with TLS options the client sends through node:https instead,
// whose Agent takes them. Both answer the same small shape.
//
// fetch also cannot send a path with a dot segment: the URL standard reads "%2E%2E" as
// ".." and removes it, so the record of key ".." would become a list of the tenant. Such
// paths go through node:http(s), which sends the path as given.

import * as http from "node:http";
import * as https from "node:https";

export interface HttpRequest {
  method: string;
  /** scheme://host:port */
  base: string;
  /** The escaped path and query, sent as is. */
  path: string;
  headers: { [name: string]: string };
  body?: string;
  signal: AbortSignal;
}

export interface HttpResponse {
  status: number;
  /** The Idemkv-Leader header, or null. */
  leader: string | null;
  body: string;
}

export type Send = (req: HttpRequest) => Promise<HttpResponse>;

/** TLS settings for https endpoints: PEM text (or bytes) as Node's tls module takes them. */
export interface TlsOptions {
  /** CA bundle that signs the nodes' certificates (default: Node's own roots). */
  ca?: string | Uint8Array | Array<string | Uint8Array>;
  /** Client certificate and key, for mutual TLS. */
  cert?: string | Uint8Array;
  key?: string | Uint8Array;
  passphrase?: string;
  /** The name to verify the certificate against, when it is not the endpoint's host. */
  servername?: string;
  /** false skips verification. Tests only. */
  rejectUnauthorized?: boolean;
}

export const HEADER_LEADER = "Idemkv-Leader";

/**
 * Bounds what a node may send back (the Python client's MAX_ANSWER_BYTES): idemkv answers
 * are small (a record with its result, a page of 1000 records); this only stops a
 * confused or hostile peer from making the client read until it runs out of memory. A
 * longer answer fails as one cut short.
 */
export const MAX_ANSWER_BYTES = 64 << 20;

function tooLarge(): Error {
  return new Error(`the answer is larger than ${MAX_ANSWER_BYTES} bytes`);
}

/** The text of res's body, failing past MAX_ANSWER_BYTES. */
async function boundedText(res: Response): Promise<string> {
  if (res.body === null) return "";
  const reader = res.body.getReader();
  const chunks: Uint8Array[] = [];
  let n = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    n += value.length;
    if (n > MAX_ANSWER_BYTES) {
      await reader.cancel().catch(() => undefined);
      throw tooLarge();
    }
    chunks.push(value);
  }
  return new TextDecoder().decode(concat(chunks));
}

export function fetchSend(f: typeof fetch): Send {
  return async (req) => {
    const init: RequestInit = { method: req.method, headers: req.headers, signal: req.signal };
    if (req.body !== undefined) init.body = req.body;
    const res = await f(req.base + req.path, init);
    const body = await boundedText(res);
    return { status: res.status, leader: res.headers.get(HEADER_LEADER), body };
  };
}

/**
 * A sender over node:http and node:https, with keep-alive Agents (the https one carries
 * the TLS options). The path goes out exactly as given.
 */
export function nodeSend(tls: TlsOptions = {}): { send: Send; close: () => void } {
  const opts: https.AgentOptions = { keepAlive: true };
  if (tls.ca !== undefined) opts.ca = tls.ca;
  if (tls.cert !== undefined) opts.cert = tls.cert;
  if (tls.key !== undefined) opts.key = tls.key;
  if (tls.passphrase !== undefined) opts.passphrase = tls.passphrase;
  if (tls.servername !== undefined) opts.servername = tls.servername;
  if (tls.rejectUnauthorized !== undefined) opts.rejectUnauthorized = tls.rejectUnauthorized;
  const secure = new https.Agent(opts);
  const plain = new http.Agent({ keepAlive: true });
  const send: Send = (req) =>
    new Promise<HttpResponse>((resolve, reject) => {
      const u = new URL(req.base);
      const o = {
        method: req.method, headers: req.headers, signal: req.signal,
        hostname: u.hostname.replace(/^\[(.*)\]$/, "$1"), port: u.port, path: req.path,
      };
      const onResponse = (res: http.IncomingMessage) => {
        const chunks: Uint8Array[] = [];
        let n = 0;
        res.on("data", (c: Uint8Array) => {
          n += c.length;
          if (n > MAX_ANSWER_BYTES) {
            const err = tooLarge();
            res.destroy(err);
            reject(err);
            return;
          }
          chunks.push(c);
        });
        res.on("error", reject);
        res.on("end", () => {
          const h = res.headers[HEADER_LEADER.toLowerCase()];
          resolve({
            status: res.statusCode ?? 0,
            leader: typeof h === "string" ? h : null,
            body: new TextDecoder().decode(concat(chunks)),
          });
        });
      };
      const r = u.protocol === "https:"
        ? https.request({ ...o, agent: secure }, onResponse)
        : http.request({ ...o, agent: plain }, onResponse);
      r.on("error", reject);
      r.end(req.body);
    });
  return {
    send,
    close: () => {
      secure.destroy();
      plain.destroy();
    },
  };
}

function concat(chunks: Uint8Array[]): Uint8Array {
  let n = 0;
  for (const c of chunks) n += c.length;
  const out = new Uint8Array(n);
  let i = 0;
  for (const c of chunks) {
    out.set(c, i);
    i += c.length;
  }
  return out;
}
