// The wire shapes of idemkv's HTTP API (docs/protocol.md), field for field: requests and
// answers keep their JSON names, so that what a program sends is what curl would send.
// Timestamps are RFC 3339 strings with milliseconds, in UTC. Fences are Raft indexes,
// far below 2^53, so a JavaScript number holds them exactly.

export type Decision = "execute" | "replay" | "conflict" | "in_progress" | "recover" | "needs_approval";
export type Status = "pending" | "committed" | "failed" | "awaiting_approval";
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
  /** On a record that asked for an approval (section 7); kept after it is consumed. */
  approval?: Approval;
  /** The effect's canonical JSON, kept on a record that asked for an approval. */
  effect?: unknown;
}

export type ApprovalState = "waiting" | "approved" | "denied";

/** The approval a record asked for, and its decision once there is one (docs/protocol.md section 7). */
export interface Approval {
  /** "apr_" and the Raft index of the entry that asked: a later request under the key gets another. */
  id: string;
  state: ApprovalState;
  summary?: string;
  requested_at: string;
  /** When a waiting approval lapses unanswered. */
  expires_at: string;
  /** Required by an admin's rule rather than by the request. */
  by_rule?: boolean;
  approver?: string;
  reason?: string;
  decided_at?: string;
}

/** A reserve's request for approval. */
export interface ApprovalAsk {
  required: boolean;
  ttl_ms?: number;
  summary?: string;
}

/** POST /v1/approvals/{tenant}/{key}: the approval id and fingerprint are what the approver saw. */
export interface DecideApprovalRequest {
  tenant: string;
  idempotency_key: string;
  approval_id: string;
  effect_fingerprint: string;
  decision: "approve" | "deny";
  approver: string;
  reason?: string;
}

export interface ApprovalsOptions {
  limit?: number;
  /** The next of an earlier page. */
  after?: string;
  consistency?: Consistency;
}

/** One page of waiting approvals, oldest requested_at first: records with approval, tool and effect. */
export interface ApprovalsResult {
  approvals: Record[];
  next?: string;
}

export interface ApprovalRule {
  tenant: string;
  tool: string;
  ttl_ms: number;
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
  /** Asks for a person's approval before the effect runs; needs effect. */
  approval?: ApprovalAsk;
}

export interface ReserveResult {
  decision: Decision;
  fence?: number;
  attempt_id?: string;
  lease_expires_at?: string;
  receipt?: Receipt;
  conflict?: Conflict;
  /** On needs_approval: the request to show the approver. */
  approval?: Approval;
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
