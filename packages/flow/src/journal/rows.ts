import { z } from "zod";
import {
  BranchMergedRow,
  BranchUnmergedRow,
  CallWorkSchema,
  CommitIntendedRow,
  RunBranchRow,
} from "./workRows.js";

/**
 * The rows of a flow run's journal (`<state>/flow/<run>/journal.jsonl`), in the seed's words. Every row is
 * validated on write and on read. The journal has one writer, the run's process; every command reads.
 *
 * A session call's rows, in order: prepared, then per turn step_published (the intent, committed before the
 * step and packet files), thread_started + turn_started in one batch when a subagent is bound (a send_input
 * turn writes turn_started only), then a terminal row: completed, null_model or held. session_attempt_lost
 * ends an attempt; interrupt_requested records an interrupt before it is sent.
 */

export const ROLES = ["architect", "executor", "executor-t1", "reviewer", "explorer", "critic"] as const;
export const RoleSchema = z.enum(ROLES);
export type Role = z.infer<typeof RoleSchema>;

/** A role's pair; null is a part the role table leaves undecided (the host decides it). */
export const PairSchema = z.object({ model: z.string().nullable(), effort: z.string().nullable() });
export type Pair = z.infer<typeof PairSchema>;

/** Token parts; a part that is 0 is left out of a row, and a row without a part reads it as 0. */
export const TokensSchema = z.object({
  input: z.number().int().nonnegative().optional(),
  cached_input: z.number().int().nonnegative().optional(),
  output: z.number().int().nonnegative().optional(),
  reasoning_output: z.number().int().nonnegative().optional(),
  total: z.number().int().nonnegative().optional(),
});
export type Tokens = z.infer<typeof TokensSchema>;

export const BackendSchema = z.enum(["session", "app-server", "local"]);
export type Backend = z.infer<typeof BackendSchema>;

const base = { seq: z.number().int().nonnegative(), at: z.string() };
const callBase = { ...base, call: z.string(), op: z.string() };

export const CallInputSchema = z.object({
  role: RoleSchema,
  task: z.string(),
  schema: z.record(z.string(), z.unknown()).nullable(),
  workspace: z.string().nullable(),
  /** A continuation: the continued call and its subagents' thread chain (part of the input digest). */
  resume: z.object({ call: z.string(), chain: z.array(z.string()) }).optional(),
  /** A continuation's explicit effort (checked against the handle's subagent when the role leaves it open). */
  effort: z.string().optional(),
  /** How long each attempt may run before its turn is interrupted and the call held (`deadline`). */
  deadline_ms: z.number().int().positive().optional(),
});
export type CallInput = z.infer<typeof CallInputSchema>;

export const StartedRow = z.object({
  ...base,
  type: z.literal("started"),
  /** Absent in a journal of a run that recorded none: such a run is an App Server run. */
  backend: BackendSchema.optional(),
  role_pairs: z.record(z.string(), PairSchema),
  policy_digest: z.string(),
  /** The token of the process lock `process.<token>.lock` this process holds; null when it took none. */
  process: z.string().nullable(),
  pid: z.number().int(),
  /** This is the run's n-th started row. */
  process_n: z.number().int().positive(),
  /**
   * The workflow module this process runs when it is not the one run.json names (`crw flow resume RUN
   * SCRIPT`): later processes of the run run it too.
   */
  workflow: z.string().optional(),
});

export const PolicyRepinnedRow = z.object({
  ...base,
  type: z.literal("policy_repinned"),
  pinned_digest: z.string(),
  store_digest: z.string(),
  role_pairs: z.record(z.string(), PairSchema),
});

export const PreparedRow = z.object({
  ...callBase,
  type: z.literal("prepared"),
  role: RoleSchema,
  input: CallInputSchema,
  input_digest: z.string(),
  backend: BackendSchema,
  /** The allocation every attempt of the call shares: its directory P. */
  allocation: z.object({
    workspace: z.string(),
    kind: z.enum(["scratch", "worktree", "given"]),
    /** A worktree's start commit (the repository's HEAD when the call was prepared). */
    start: z.string().optional(),
  }),
});

export const RepairSchema = z.object({ answer: z.string(), errors: z.array(z.string()) });

export const StepPublishedRow = z.object({
  ...callBase,
  type: z.literal("step_published"),
  k: z.number().int().positive(),
  marker: z.string(),
  attempt: z.number().int().positive(),
  action: z.enum(["spawn", "send_input"]),
  input: z.string(),
  input_digest: z.string(),
  packet: z.string(),
  packet_digest: z.string(),
  role: RoleSchema,
  agent_type: z.string(),
  model: z.string().nullable(),
  effort: z.string().nullable(),
  workspace: z.string(),
  agent_id: z.string().optional(),
  note: z.string().optional(),
  previous_answer: z.string().optional(),
  /** For a repair turn: the answer it repairs and why it failed. */
  repair: RepairSchema.optional(),
  tokens_seen: TokensSchema.optional(),
  call_tokens: TokensSchema.optional(),
  conversation_turn: z.number().int().positive(),
  replaces_turn: z.number().int().positive().optional(),
  /** A spawn step of a gated executor role in a run with an evidence cwd (written by the evidence work). */
  evidence_assignment: z.string().optional(),
  evidence_cwds: z.array(z.string()).optional(),
  evidence_ignored: z.array(z.string()).optional(),
});

export const ThreadStartedRow = z.object({
  ...base,
  type: z.literal("thread_started"),
  call: z.string(),
  thread_id: z.string(),
  model: z.string().nullable(),
  effort: z.string().nullable(),
  cwd: z.string(),
  host_cwd: z.string().nullable(),
  parent_thread_id: z.string().nullable(),
  agent_role: z.string().nullable(),
  attempt: z.number().int().positive(),
  /** session: a subagent the owner spawned; app-server / local: a thread the run opened itself. */
  via: z.enum(["session", "app-server", "local"]),
  rollout_path: z.string().nullable(),
  marker: z.string(),
  pair_unchecked: z.boolean().optional(),
  effort_unchecked: z.boolean().optional(),
  session_agent_role_mismatch: z.object({ expected: z.string(), actual: z.string().nullable() }).optional(),
  prior_pairs: z.array(PairSchema).optional(),
  /** The cwd the stop hook claims its receipt under, for a step with a flow evidence record. */
  evidence_cwd: z.string().optional(),
});

export const TurnStartedRow = z.object({
  ...callBase,
  type: z.literal("turn_started"),
  k: z.number().int().positive(),
  turn_id: z.string(),
  attempt: z.number().int().positive(),
  marker: z.string(),
  conversation_turn: z.number().int().positive().optional(),
  replaces_turn: z.number().int().positive().optional(),
});

export const InterruptRequestedRow = z.object({
  ...callBase,
  type: z.literal("interrupt_requested"),
  reason: z.string(),
  k: z.number().int().positive(),
  attempt: z.number().int().positive(),
  turn_id: z.string().nullable(),
});

export const SessionAttemptLostRow = z.object({
  ...callBase,
  type: z.literal("session_attempt_lost"),
  attempt: z.number().int().positive(),
  agent_id: z.string(),
  k: z.number().int().positive(),
  turn_id: z.string().nullable(),
  reason: z.string(),
  host_status: z.string(),
  turn_status: z.string().nullable(),
});

export const CompletedRow = z.object({
  ...callBase,
  type: z.literal("completed"),
  k: z.number().int().positive(),
  attempt: z.number().int().positive(),
  result: z.unknown(),
  result_digest: z.string(),
  raw_text: z.string(),
  extracted: z.boolean(),
  tokens: TokensSchema,
  /** An executor whose subagent moved HEAD: the commit is kept on the stray ref. */
  executor_head_moved: z.object({ start: z.string(), head: z.string(), ref: z.string() }).optional(),
  /**
   * An executor in a worktree: its pending tree (P as it stands, untracked files included) and the call's
   * state the proof takes: the recorded stray HEAD whose tree is the pending tree, else null (the pending
   * tree is the state; crw.commit commits it on the start).
   */
  executor_state: z.object({ pending_tree: z.string(), stray_head: z.string().nullable() }).optional(),
  /** The harvested subagent's cumulative count at this harvest (a later call bound to it counts from there). */
  thread_tokens: z.object({ thread_id: z.string(), tokens: TokensSchema }).optional(),
  /** In a git checkout: what the call changed (its start, crw's commit of its changes, the paths). */
  work: CallWorkSchema.optional(),
});

export const NullModelRow = z.object({
  ...callBase,
  type: z.literal("null_model"),
  reason: z.string(),
  raw_text: z.string().optional(),
  errors: z.array(z.string()).optional(),
  tokens: TokensSchema,
  thread_tokens: z.object({ thread_id: z.string(), tokens: TokensSchema }).optional(),
});

export const HeldRow = z.object({
  ...callBase,
  type: z.literal("held"),
  reason: z.string(),
  detail: z.string().optional(),
  tokens: TokensSchema.optional(),
});

export const TokensUnmeasuredRow = z.object({
  ...callBase,
  type: z.literal("tokens_unmeasured"),
  k: z.number().int().positive(),
  turn_id: z.string(),
  pauses: z.literal(false),
  reason: z.string(),
});

export const StepUnwrittenRow = z.object({
  ...base,
  type: z.literal("step_unwritten"),
  call: z.string(),
  marker: z.string(),
  k: z.number().int().positive(),
  attempt: z.number().int().positive(),
  action: z.string(),
  input_state: z.literal("not_delivered"),
  error: z.string(),
  failures: z.number().int().positive(),
  first_at: z.string(),
  last_at: z.string(),
  /** Only on the closing row: whether the step got written in the end. */
  written: z.boolean().optional(),
});

export const SessionHostWarningRow = z.object({
  ...base,
  type: z.literal("session_host_warning"),
  op: z.string(),
  warnings: z.array(z.enum(["no_ledger_line", "ledger_op_differs", "several_spawns", "window_ended"])),
});

/** Written by no command of this crw; read so that an older run's journal stays readable. */
export const RoleStoreChangedRow = z.object({
  ...base,
  type: z.literal("role_store_changed"),
  pinned_digest: z.string(),
  store_digest: z.string(),
});

/** The intent to write a step's flow evidence record under a directory; committed before the record. */
export const EvidencePlacedRow = z.object({
  ...base,
  type: z.literal("evidence_placed"),
  call: z.string(),
  evidence_assignment: z.string(),
  evidence_cwd: z.string(),
  attempt: z.number().int().positive(),
  marker: z.string(),
});

/** A wake of the owner thread the run staged (flow row). */
export const SessionWakeRow = z.object({
  ...base,
  type: z.literal("session_wake"),
  batch: z.string(),
  wake_id: z.string(),
  renotify: z.number().int().nonnegative(),
  ops: z.array(z.string()),
  owner: z.string(),
  owner_status: z.string(),
  waiting_seconds: z.number().nonnegative(),
  staged: z.boolean(),
  error: z.string().optional(),
  reason: z.string().optional(),
  /**
   * How the staged message reaches the owner: a new turn on an idle thread, a resume and a turn on a
   * notLoaded one, after the current turn on a busy (active) one. Absent from a row written before it.
   */
  delivery: z.enum(["new_turn", "resume_and_turn", "after_turn"]).optional(),
});

/**
 * The delivery of a staged wake (flow row): the owner turn it started (delivered), or why it was not
 * (another wake of a later round took its place while the owner was busy, no step waits any more, the
 * host refused the turn).
 */
export const MessageDeliveryRow = z.object({
  ...base,
  type: z.literal("message_delivery"),
  wake_id: z.string(),
  owner: z.string(),
  delivered: z.boolean(),
  turn_id: z.string().optional(),
  owner_status: z.string(),
  reason: z.string().optional(),
});

/** The session_unresponsive escalation (flow row); the run goes on. */
export const EscalationRow = z.object({
  ...base,
  type: z.literal("escalation"),
  reason: z.literal("session_unresponsive"),
  owner: z.string(),
  ops: z.array(z.string()),
  batch: z.string(),
  waiting_seconds: z.number().nonnegative(),
});

/**
 * The Trace digests of a call (flow row): P's (workspace), the owner's checkout's (outside) and the run's
 * shared state's, taken when its subagent was bound and when its answer was harvested. The warnings are
 * judged from them, so `crw flow shadow` judges them again from the rows.
 */
export const TraceDigestsRow = z.object({
  ...base,
  type: z.literal("trace_digests"),
  call: z.string(),
  op: z.string(),
  point: z.enum(["bind", "harvest"]),
  digests: z.object({ workspace: z.string().nullable(), outside: z.string().nullable(), shared: z.string() }),
});

/** A flow warning of the Trace digests and the like: read_role_wrote, executor_wrote_outside, … */
export const FlowWarningRow = z.object({
  ...base,
  type: z.literal("flow_warning"),
  warning: z.string(),
  call: z.string().optional(),
  op: z.string().optional(),
  detail: z.record(z.string(), z.unknown()).optional(),
});

/** The workflow waits for a decision (`ctx.decide`): the run pauses waiting_decision until it is answered. */
export const DecisionRequestedRow = z.object({
  ...base,
  type: z.literal("decision_requested"),
  decision: z.string(),
  question: z.string(),
  options: z.array(z.string()).optional(),
});

/** The answer `crw flow answer` stored for a decision; one per decision, applied once. */
export const DecisionAnsweredRow = z.object({
  ...base,
  type: z.literal("decision_answered"),
  decision: z.string(),
  answer: z.string(),
});

export const RunPausedRow = z.object({
  ...base,
  type: z.literal("run_paused"),
  reason: z.string(),
  call: z.string().optional(),
});

/**
 * `crw flow cancel` asked the run to end: once this row is durable the run ends cancelled, also when the
 * process that wrote it dies first (the next process stops the calls it finds open and ends the run).
 */
export const CancelRequestedRow = z.object({
  ...base,
  type: z.literal("cancel_requested"),
  reason: z.string(),
  requested_at: z.string(),
});

export const RunEndedRow = z.object({
  ...base,
  type: z.literal("run_ended"),
  status: z.enum(["completed", "failed", "cancelled"]),
  result: z.unknown().optional(),
  error: z.string().optional(),
  /** A cancelled run's reason, as its request gave it. */
  reason: z.string().optional(),
});

export const JournalRowSchema = z.discriminatedUnion("type", [
  StartedRow,
  PolicyRepinnedRow,
  PreparedRow,
  StepPublishedRow,
  ThreadStartedRow,
  TurnStartedRow,
  InterruptRequestedRow,
  SessionAttemptLostRow,
  CompletedRow,
  NullModelRow,
  HeldRow,
  TokensUnmeasuredRow,
  StepUnwrittenRow,
  SessionHostWarningRow,
  RoleStoreChangedRow,
  EvidencePlacedRow,
  SessionWakeRow,
  MessageDeliveryRow,
  EscalationRow,
  TraceDigestsRow,
  FlowWarningRow,
  DecisionRequestedRow,
  DecisionAnsweredRow,
  RunPausedRow,
  CancelRequestedRow,
  RunEndedRow,
  RunBranchRow,
  CommitIntendedRow,
  BranchMergedRow,
  BranchUnmergedRow,
]);
export type JournalRow = z.infer<typeof JournalRowSchema>;
export type RowType = JournalRow["type"];
export type RowOf<T extends RowType> = Extract<JournalRow, { type: T }>;
/** A row as a writer hands it over: the journal stamps seq and at. */
export type NewRow = JournalRow extends infer R
  ? R extends JournalRow
    ? Omit<R, "seq" | "at">
    : never
  : never;

export const JOURNAL_FORMAT = "crw-flow-journal";
export const JOURNAL_VERSION = 1;
export const JournalHeaderSchema = z.object({
  format: z.literal(JOURNAL_FORMAT),
  version: z.number().int(),
  run_id: z.string(),
  created_at: z.string(),
});
export type JournalHeader = z.infer<typeof JournalHeaderSchema>;
