// The wire shapes of idemkv's HTTP API (docs/protocol.md), field for field: requests and
// answers keep their JSON names, so that what a program sends is what curl would send.
// Timestamps are RFC 3339 strings with milliseconds, in UTC. Fences are Raft indexes,
// far below 2^53, so a JavaScript number holds them exactly.

export type Decision = "execute" | "replay" | "conflict" | "in_progress" | "recover";
export type Status = "pending" | "committed" | "failed";
export type Consistency = "linearizable" | "stale";

/** What a permanent failure stored. */
export interface ErrorInfo {
  code: string;
  message: string;
  details?: unknown;
}

export interface StoredReceipt {
  remote_system: string;
  remote_id: string;
  remote_url?: string;
  result?: unknown;
  committed_at: string;
}

export interface Record {
  tenant: string;
  idempotency_key: string;
  effect_fingerprint: string;
  tool: string;
  actor?: string;
  status: Status;
  fence: number;
  attempt_id?: string;
  attempts: number;
  created_at: string;
  updated_at: string;
  lease_expires_at?: string;
  expires_at: string;
  receipt?: StoredReceipt;
  error?: ErrorInfo;
  /** Set when an attempt died and nobody can tell whether its effect happened. */
  in_doubt?: boolean;
  in_doubt_since?: string;
}

/** What a replay returns: the stored outcome of the key. */
export interface Receipt {
  idempotency_key: string;
  effect_fingerprint: string;
  status: Status;
  remote_system?: string;
  remote_id?: string;
  remote_url?: string;
  committed_at?: string;
  result?: unknown;
  error?: ErrorInfo;
}

export interface Conflict {
  status: "conflict";
  reason: string;
  existing_fingerprint: string;
  received_fingerprint: string;
  existing_remote_id?: string;
  existing_tool?: string;
  received_tool?: string;
}

export interface ReserveRequest {
  tenant: string;
  idempotency_key: string;
  tool: string;
  actor?: string;
  /** The fingerprint computed here (see fingerprint()), or... */
  effect_fingerprint?: string;
  /** ...the effect itself, for the server to fingerprint. */
  effect?: unknown;
  attempt_id?: string;
  lease_ttl_ms?: number;
  ttl_ms?: number;
  expires_at?: string;
}

export interface ReserveResult {
  decision: Decision;
  fence?: number;
  attempt_id?: string;
  lease_expires_at?: string;
  receipt?: Receipt;
  conflict?: Conflict;
  record: Record;
}

interface Fenced {
  tenant: string;
  idempotency_key: string;
  effect_fingerprint: string;
  fence: number;
}

export interface CommitRequest extends Fenced {
  remote_system: string;
  remote_id: string;
  remote_url?: string;
  result?: unknown;
}

export interface FailRequest extends Fenced {
  error: ErrorInfo;
}

export type ReleaseRequest = Fenced;

export type DoubtRequest = Fenced;

export interface HeartbeatRequest {
  tenant: string;
  idempotency_key: string;
  fence: number;
  lease_ttl_ms?: number;
}

/** Settles an in-doubt record without a fence: commit this receipt, or release the key. */
export type ResolveRequest =
  | {
      tenant: string;
      idempotency_key: string;
      effect_fingerprint: string;
      outcome: "committed";
      remote_system: string;
      remote_id: string;
      remote_url?: string;
      result?: unknown;
    }
  | {
      tenant: string;
      idempotency_key: string;
      effect_fingerprint: string;
      outcome: "not_executed";
    };

export interface ReleaseResult {
  released: boolean;
}

export interface GetOptions {
  /** Long-poll: wait up to this many ms for the record to stop being pending. */
  waitMs?: number;
  consistency?: Consistency;
}

export interface ListOptions {
  prefix?: string;
  status?: Status;
  /** Only records marked in doubt. */
  inDoubt?: boolean;
  limit?: number;
  after?: string;
  consistency?: Consistency;
}

export interface ListResult {
  records: Record[];
  next?: string;
}

export interface ClusterNode {
  id: string;
  raft_addr: string;
  api_addr: string;
  suffrage: string;
  state: string;
}

export interface ClusterInfo {
  leader: { id: string; api_addr: string };
  nodes: ClusterNode[];
  term: number;
  commit_index: number;
  applied_index: number;
}
