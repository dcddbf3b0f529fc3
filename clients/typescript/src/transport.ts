// How one HTTP request goes out. Node's global fetch is the default; it cannot take a
// custom CA or a client certificate (that needs an undici Agent, which Node bundles but
// does not export), so with TLS options the client sends through node:https instead,
// whose Agent takes them. Both answer the same small shape.

import * as https from "node:https";

export interface HttpRequest {
  method: string;
  url: string;
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

export function fetchSend(f: typeof fetch): Send {
  return async (req) => {
    const init: RequestInit = { method: req.method, headers: req.headers, signal: req.signal };
    if (req.body !== undefined) init.body = req.body;
    const res = await f(req.url, init);
    const body = await res.text();
    return { status: res.status, leader: res.headers.get(HEADER_LEADER), body };
  };
}

/** A sender over node:https with its own keep-alive Agent carrying the TLS options. */
export function httpsSend(tls: TlsOptions): { send: Send; close: () => void } {
  const opts: https.AgentOptions = { keepAlive: true };
  if (tls.ca !== undefined) opts.ca = tls.ca;
  if (tls.cert !== undefined) opts.cert = tls.cert;
  if (tls.key !== undefined) opts.key = tls.key;
  if (tls.passphrase !== undefined) opts.passphrase = tls.passphrase;
  if (tls.servername !== undefined) opts.servername = tls.servername;
  if (tls.rejectUnauthorized !== undefined) opts.rejectUnauthorized = tls.rejectUnauthorized;
  const agent = new https.Agent(opts);
  const send: Send = (req) =>
    new Promise<HttpResponse>((resolve, reject) => {
      const r = https.request(req.url, { method: req.method, headers: req.headers, agent, signal: req.signal }, (res) => {
        const chunks: Uint8Array[] = [];
        res.on("data", (c) => chunks.push(c));
        res.on("error", reject);
        res.on("end", () => {
          const h = res.headers[HEADER_LEADER.toLowerCase()];
          resolve({
            status: res.statusCode ?? 0,
            leader: typeof h === "string" ? h : null,
            body: new TextDecoder().decode(concat(chunks)),
          });
        });
      });
      r.on("error", reject);
      r.end(req.body);
    });
  return { send, close: () => agent.destroy() };
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
