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
  /** The effect's canonical JSON, when the reserve stored it (store_effect, a rule, an approval). */
  effect?: unknown;
  /** JSON Pointers whose values the stored effect holds as "***". */
  effect_mask?: string[];
  /** Only when asked for (get with history: true): the last 16 events, oldest first. */
  history?: HistoryEvent[];
  history_dropped?: number;
}

export type EventKind =
  | "execute" | "recover" | "commit" | "fail" | "release" | "doubt" | "resolve"
  | "approval_requested" | "approval_decided";

/** One event of a record's history (docs/protocol.md "History and explained conflicts"). */
export interface HistoryEvent {
  at: string;
  event: EventKind;
  fence?: number;
  attempt_id?: string;
  actor?: string;
  detail?: string;
}

/**
 * What a release (or a resolve as not executed) left of a key: its history, ended by
 * that event, kept until the record would have expired (docs/protocol.md, "Released keys").
 */
export interface Tombstone {
  tenant: string;
  idempotency_key: string;
  tool: string;
  effect_fingerprint: string;
  released_at: string;
  expires_at: string;
  history: HistoryEvent[];
  history_dropped: number;
}

/** Where a conflicting effect differs from the stored one; absent means the member is absent. */
export interface DiffEntry {
  path: string;
  stored?: unknown;
  received?: unknown;
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
  /** Absent on a rule that requires no approval. */
  ttl_ms?: number;
  /** false: the rule only stores or masks effects (docs/protocol.md section 8). */
  require_approval?: boolean;
  store_effect?: boolean;
  /** JSON Pointers whose values stored effects keep as "***"; "*" matches any member or element. */
  mask?: string[];
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
  /** Set when the record stored its effect and the reserve sent one. */
  diff?: DiffEntry[];
  diff_omitted?: number;
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
  /** Keep the effect in the record, so that a later conflict carries a diff (needs effect). */
  store_effect?: boolean;
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
  /** Include the record's history. */
  history?: boolean;
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
  /** Whether the answering leader reaches it, and when it last heard from it. */
  reachable?: boolean;
  last_contact?: string;
  /** The highest data format the node advertised that it reads (docs/operations.md, "Upgrading"). */
  format?: number;
}

/** The answering node's clock against the state machine's (docs/protocol.md, "Followers"). */
export interface ClockInfo {
  anchored: boolean;
  offset_ms?: number;
  measured_ago_ms?: number;
  local_answers: boolean;
  local_answers_off?: string;
}

export interface ClusterInfo {
  leader: { id: string; api_addr: string };
  nodes: ClusterNode[];
  term: number;
  commit_index: number;
  applied_index: number;
  /** The cluster's data format: what every member reads. */
  format?: number;
  clock?: ClockInfo;
}
