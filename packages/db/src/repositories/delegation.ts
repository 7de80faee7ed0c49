import type { PrefixReclaim } from "../delegation/forks.js";
import type { Project } from "../delegation/projects.js";
import type { IsolatedWorktreeRow, NewIsolatedWorktree } from "../delegation/worktrees.js";
import type { JournalEntry, JournalWrite, ProviderUsage, TranscriptMessage } from "./journal.js";

export type { PrefixReclaim, PrefixReclaimRefusal } from "../delegation/forks.js";

/**
 * The asynchronous contracts of the delegation core's persistence. Every read and write names the
 * principal account, and child reads name the parent too: a session of another account, or a child of
 * another parent, is "not found", never a different answer. The PostgreSQL implementation is
 * `PgDelegationRepository`.
 */

export interface AccountGrant {
  /** null: every tool; [] : none. */
  readonly toolAllow: readonly string[] | null;
  readonly toolDeny: readonly string[];
  readonly permissionSettings: Readonly<Record<string, unknown>>;
  readonly isOwner: boolean;
  readonly isAdministrator: boolean;
}

export interface Account extends AccountGrant {
  readonly id: string;
  readonly name: string;
}

/** An API token as lists show it: never the token, never its whole hash. */
export interface ApiTokenView {
  /** The first six bytes of the token's sha-256, in hex. */
  readonly id: string;
  readonly accountId: string;
  readonly accountName: string;
  readonly label: string;
  readonly createdAt: Date;
  readonly revokedAt: Date | null;
}

export interface NewAccount {
  readonly name: string;
  readonly toolAllow?: readonly string[] | null;
  readonly toolDeny?: readonly string[];
  readonly permissionSettings?: Record<string, unknown>;
  readonly isOwner?: boolean;
  readonly isAdministrator?: boolean;
}

export interface SessionRow {
  readonly id: string;
  readonly kind: "root" | "delegated";
  readonly parentSessionId: string | null;
  readonly principalAccountId: string;
  readonly model: string;
  /** Canonical JSON of the durable scope (delegated sessions only). */
  readonly scope: string | null;
  /** The system prompt composed once for the session (null until its first turn). */
  readonly systemPrompt: string | null;
  readonly createdAt: Date;
  /**
   * A fork's inherited prefix: its rows seq 1..inheritedThrough were copied from its parent (null when it
   * inherited nothing). Read from the row where the repository has it.
   */
  readonly inheritedThrough?: number | null;
  /** `client`: a root session its client drives (an MCP client); crw runs no model turn for it. */
  readonly driver?: "model" | "client";
  /** A client session's name, unique per account (how a restarted client finds it again). */
  readonly name?: string | null;
}

export type RunStatus = "queued" | "running" | "settling" | "succeeded" | "failed" | "aborted";
export const OPEN_RUN_STATUSES: readonly RunStatus[] = ["queued", "running", "settling"];

export interface SubagentRun {
  readonly id: string;
  readonly parentSessionId: string;
  readonly principalAccountId: string;
  readonly toolCallId: string;
  /** null only when boot discarded the unfinished private fork copy this call created. */
  readonly childSessionId: string | null;
  readonly kind: "delegate" | "continue";
  readonly mode: "foreground" | "background";
  readonly task: string;
  readonly status: RunStatus;
  readonly generation: number;
  readonly readOnlyScope: string | null;
  /** The model this one call runs on (a continuation's model argument); null: the child session's model. */
  readonly model?: string | null;
  /** The newest published progress snapshot (canonical JSON) and its seq; absent in rows read before 0020. */
  readonly progress?: string | null;
  readonly progressSeq?: number;
  readonly recoveryAttempts: number;
  /** Continuations after interruptions that left no effect of unknown outcome (never charged). */
  readonly freeContinuations?: number;
  readonly error: { readonly code: string; readonly message: string } | null;
  readonly createdAt: Date;
  readonly startedAt: Date | null;
  readonly settledAt: Date | null;
}

export interface NewDelegation {
  readonly parentSessionId: string;
  readonly principalAccountId: string;
  readonly toolCallId: string;
  readonly task: string;
  readonly mode: "foreground" | "background";
  readonly model: string;
  /** Canonical JSON of the captured scope. */
  readonly scope: string;
  /** A fork copy: private until `commitFork`, after its journal branch has been copied. */
  readonly fork?: { readonly fromSessionId: string };
  /** An isolated child's worktree, recorded with the child in one transaction. */
  readonly worktree?: NewIsolatedWorktree;
}

export interface NewContinuation {
  readonly parentSessionId: string;
  readonly principalAccountId: string;
  readonly childSessionId: string;
  readonly toolCallId: string;
  readonly task: string;
  readonly mode: "foreground" | "background";
  readonly readOnlyScope: string | null;
  /** This call's own model (not stored on the child session). */
  readonly model?: string;
  /**
   * A promotion: the child's durable scope is replaced by this canonical JSON (minted from the caller's
   * live access) in the same transaction that opens the call.
   */
  readonly promotedScope?: string;
}

export interface SettledResult {
  readonly runId: string;
  readonly generation: number;
  readonly resultId: string;
  readonly outcome: "ok" | "error";
  /** The inline body or the bounded spill placeholder. */
  readonly body: string;
  readonly byteSize: number;
  readonly spillId?: string;
  readonly error?: { readonly code: string; readonly message: string };
  /**
   * Drop the child's pending text steers with this reason, in the settlement's own statement (only when it
   * settles): a follow-up the settled call can no longer take gets its dropped notice instead of waiting.
   */
  readonly dropSteers?: string;
  /**
   * The parent whose inbox takes the result, when the caller knows it: decides whether the inbox wake is
   * sent (unknown: it is).
   */
  readonly parentSessionId?: string;
  /**
   * The call's last progress snapshot not yet published, written with the settlement (as recordRunProgress
   * would: the progress columns only, unless a newer snapshot is stored).
   */
  readonly progress?: { readonly seq: number; readonly snapshot: string };
}

/** A whole-workflow summary for the parent's inbox (one per workflow tool call). */
export interface NewWorkflowSummary {
  readonly resultId: string;
  readonly parentSessionId: string;
  readonly principalAccountId: string;
  readonly toolCallId: string;
  readonly outcome: "ok" | "error";
  readonly body: string;
  readonly byteSize: number;
  readonly spillId?: string;
}

export interface QueuedResult {
  readonly id: string;
  readonly queueSeq: number;
  readonly parentSessionId: string;
  readonly childSessionId: string | null;
  readonly runId: string | null;
  readonly toolCallId: string;
  readonly kind: "subagent" | "workflow_summary";
  readonly outcome: "ok" | "error";
  readonly mode: "foreground" | "background";
  readonly body: string;
  readonly byteSize: number;
  readonly spillPath: string | null;
}

/** A result delivered into its parent's journal: where, and when it was taken. */
export interface TakenResult extends QueuedResult {
  readonly journalSeq: number;
  readonly takenAt: Date;
}

export interface ChildView {
  readonly child: SessionRow;
  /** The child's newest call (its delegation or latest continuation). */
  readonly latestRun: SubagentRun;
}

export interface DeliveredResult {
  readonly resultId: string;
  readonly journalSeq: number;
  readonly toolCallId: string;
  readonly kind: "subagent" | "workflow_summary";
}

export interface SteerReceipt {
  readonly id: string;
  readonly childSessionId: string;
  readonly text: string;
  readonly status: "pending" | "delivered" | "dropped";
  readonly journalSeq: number | null;
  readonly dropReason: string | null;
}

export interface SpillRecord {
  readonly id: string;
  readonly sessionId: string;
  readonly path: string;
  readonly byteSize: number;
  readonly sha256: string;
}

/** Hooks a test or crash harness may use to stop the process inside a transaction (see brain's faults). */
export type TransactionProbe = (point: "delivery.between_append_and_ack" | "settle.before_commit") => void;

export interface AppendOptions {
  /** Called inside the transaction after the journal rows are written and before the acknowledgements. */
  readonly probe?: TransactionProbe;
}

export type { IsolatedWorktreeRow, NewIsolatedWorktree, Project };

/** The rows of a journal after a seq, with what a reader needs to know that the rows before it still hold. */
export interface JournalDelta {
  /** Rows with seq above `afterSeq`, in order: settled and provisional (their `settled` says which). */
  readonly entries: JournalEntry[];
  /** When the row at `afterSeq` was written, as it stands now; null when no settled row has that seq. */
  readonly anchorCreatedAt: Date | null;
  /** Inherited rows deleted from the journal's front so far: any change means the prefix is not what it was. */
  readonly reclaimedRows: number;
}

/** What a session still has to wait for or take: see settlementWork. */
export interface SettlementWork {
  openChildRuns: number;
  pendingSteers: number;
  queuedResults: number;
  spills: boolean;
}

export interface DelegationRepository {
  // accounts
  createAccount(input: NewAccount): Promise<Account>;
  getAccount(accountId: string): Promise<Account>;
  accountByName(name: string): Promise<Account | null>;
  addApiToken(accountId: string, tokenHash: Buffer, label?: string): Promise<void>;
  accountByTokenHash(tokenHash: Buffer): Promise<Account | null>;
  listAccounts(): Promise<(Account & { readonly createdAt: Date })[]>;
  setAccountGrants(
    accountId: string,
    grants: { toolAllow: readonly string[] | null; toolDeny: readonly string[] },
  ): Promise<Account>;
  /** The installation's owner account, made by the first daemon on the database. */
  ensureOwnerAccount(): Promise<Account>;
  listApiTokens(accountId?: string): Promise<ApiTokenView[]>;
  revokeApiToken(tokenId: string): Promise<ApiTokenView>;
  /** Of these token hashes, the ones that no longer authenticate. */
  unusableTokenHashes(hashes: readonly Buffer[]): Promise<Buffer[]>;

  // projects: directories of this host by name, and which accounts may work in them
  addProject(ref: string, root: string): Promise<Project>;
  grantProject(ref: string, accountId: string): Promise<void>;
  getProject(ref: string): Promise<Project | null>;
  listProjects(): Promise<Project[]>;
  /** The innermost project whose root is `dir` or above it. */
  projectForPath(dir: string): Promise<Project | null>;

  // isolated worktrees
  isolatedWorktree(sessionId: string, principalAccountId: string): Promise<IsolatedWorktreeRow | null>;
  addNodeWorktree(
    sessionId: string,
    principalAccountId: string,
    worktree: NewIsolatedWorktree,
    node: { workflowId: string; nodeId: string },
  ): Promise<void>;
  workflowWorktrees(workflowId: string, principalAccountId: string): Promise<IsolatedWorktreeRow[]>;
  recordWorktreeCommit(
    sessionId: string,
    principalAccountId: string,
    what: "committed" | "landed",
    commit: string,
  ): Promise<void>;

  // sessions
  /** `scope`: the canonical JSON of a root session's placement (its working directory), when it has one. */
  createRootSession(principalAccountId: string, model: string, scope?: string): Promise<SessionRow>;
  getSession(sessionId: string, principalAccountId: string): Promise<SessionRow>;
  /** A visible session and its account's live grant in one snapshot (getSession, then getAccount). */
  getSessionWithAccount(
    sessionId: string,
    principalAccountId: string,
  ): Promise<{ session: SessionRow; account: Account }>;
  /** The account's client-driven root session of that name, made on first use (`created`). */
  openClientSession(
    principalAccountId: string,
    name: string,
    model: string,
    scope?: string,
  ): Promise<{ session: SessionRow; created: boolean }>;
  /** Results already delivered into the session's journal at or after `since`, oldest first. */
  takenResults(
    sessionId: string,
    principalAccountId: string,
    since: Date,
    limit?: number,
  ): Promise<TakenResult[]>;
  /** Every child the session delegated to, each with its newest call. */
  childrenOf(sessionId: string, principalAccountId: string, limit?: number): Promise<ChildView[]>;
  /** The child, only when `parentSessionId` delegated to it (the ownership guard). */
  getChildSession(
    parentSessionId: string,
    childSessionId: string,
    principalAccountId: string,
  ): Promise<SessionRow>;
  /** Ancestors from the direct parent up to the root (cycle- and cross-account-checked). */
  ancestry(sessionId: string, principalAccountId: string): Promise<SessionRow[]>;

  // journal
  append(
    sessionId: string,
    principalAccountId: string,
    entries: readonly JournalWrite[],
    options?: AppendOptions,
  ): Promise<JournalEntry[]>;
  /**
   * append, and the session's system prompt stored in the same statement unless one is stored already
   * (first writer wins: a prompt once stored is the session's for good): a turn's first row and the prompt it ran with commit together.
   * `systemPrompt` is the one stored after it (null only when `entries` is empty: nothing was written).
   */
  appendWithSystemPrompt(
    sessionId: string,
    principalAccountId: string,
    entries: readonly JournalWrite[],
    systemPrompt: string,
  ): Promise<{ entries: JournalEntry[]; systemPrompt: string | null }>;
  /**
   * getLatestTurn: the newest turn's rows (provisional rows and custom events included, discarded never):
   * the rows after the newest settled answer, or, when none follow it, the turn that answer finished.
   */
  latestTurn(sessionId: string, principalAccountId: string): Promise<JournalEntry[]>;
  /** Settled, undiscarded rows in order; from the latest compaction's kept seq when `fromCompaction`. */
  readJournal(
    sessionId: string,
    principalAccountId: string,
    options?: { fromSeq?: number; includeProvisional?: boolean },
  ): Promise<JournalEntry[]>;
  /**
   * The settled rows from the newest settled assistant message on (the whole journal when it has none), in
   * one snapshot: whether the journal ends with an answer, and what its newest turn left open.
   */
  readJournalTail(sessionId: string, principalAccountId: string): Promise<JournalEntry[]>;
  /**
   * readJournalTail and settlementWork for the same session, in one snapshot (one statement). `whole`: a
   * short journal as readJournalAfter(0) reads it, with the seq its next row will take.
   */
  journalTailWithWork?(
    sessionId: string,
    principalAccountId: string,
  ): Promise<{
    tail: JournalEntry[];
    work: SettlementWork;
    whole?: { journal: JournalDelta; nextSeq: number };
  }>;
  /** journalTailWithWork for many sessions in one statement; a session that is not visible is missing. */
  journalTailsWithWork(
    sessions: readonly { sessionId: string; principalAccountId: string }[],
  ): Promise<
    Map<
      string,
      { tail: JournalEntry[]; work: SettlementWork; whole?: { journal: JournalDelta; nextSeq: number } }
    >
  >;
  /**
   * The rows after `afterSeq` (all of them from 0) in one snapshot, settled and provisional, never
   * discarded, with what tells a reader that the rows it holds below `afterSeq` are still the journal's.
   */
  readJournalAfter(sessionId: string, principalAccountId: string, afterSeq: number): Promise<JournalDelta>;
  /**
   * Where a fork asked by `toolCallId` branches off: the newest settled assistant message holding that
   * tool call (null when none does), and the newest settled seq.
   */
  forkPoint(
    sessionId: string,
    principalAccountId: string,
    toolCallId: string,
  ): Promise<{ askingSeq: number | null; lastSeq: number }>;
  /**
   * Assistant messages newest-first, at most `limit`, with seq below `beforeSeq`; each with the provider
   * usage recorded with it, when there is one.
   */
  recentAssistantMessages(
    sessionId: string,
    principalAccountId: string,
    limit: number,
    beforeSeq?: number,
  ): Promise<Array<{ seq: number; message: TranscriptMessage; usage?: ProviderUsage }>>;
  /** Mark provisional rows settled (a finished turn) or discarded (an interrupted tail). */
  settleProvisional(
    sessionId: string,
    principalAccountId: string,
    as: "settled" | "discarded",
  ): Promise<number>;

  // delegation
  createDelegation(input: NewDelegation): Promise<{ run: SubagentRun; child: SessionRow; created: boolean }>;
  createContinuation(input: NewContinuation): Promise<{ run: SubagentRun; created: boolean }>;
  getRun(runId: string, principalAccountId: string): Promise<SubagentRun>;
  /** The run a tool call of `parentSessionId` created, if it got that far. */
  runForToolCall(
    parentSessionId: string,
    toolCallId: string,
    principalAccountId: string,
  ): Promise<SubagentRun | null>;
  openRunForChild(childSessionId: string, principalAccountId: string): Promise<SubagentRun | null>;
  /** queued -> running; false when the row moved on (another owner, a new generation). */
  markRunStarted(runId: string, generation: number, owner: string): Promise<boolean>;
  markRunSettling(runId: string, generation: number): Promise<boolean>;
  /**
   * markRunSettling and the child's newest settled assistant message (recentAssistantMessages with limit 1)
   * in one statement; `reply` is null when the child has none. With `whenIdle`: also what settlementWork
   * gives for the child (`work`), in the same snapshot, and the run is marked only when that inbox is idle
   * (no open child run, pending steer or unacknowledged result).
   */
  markSettlingWithReply(
    runId: string,
    generation: number,
    childSessionId: string,
    principalAccountId: string,
    options?: { whenIdle?: boolean },
  ): Promise<{
    marked: boolean;
    reply: { seq: number; message: TranscriptMessage; usage?: ProviderUsage } | null;
    work?: SettlementWork;
  }>;
  /**
   * queued -> running and, for a run that had not started, the task's user message appended to the child's
   * journal, in one statement: a started run always has its task in the journal. `started` is false when
   * the row moved on (another generation, terminal); `appended` says whether the task was written now.
   * `child`, when started: the child's session row as getSession reads it (absent when not visible), and
   * `work`: what settlementWork gives for the child, in the same snapshot (the first turn's inbox look).
   * `row`: the row the start appended. `journal`: the child's whole journal, when that row is all it holds
   * (a fresh child).
   */
  startRun(
    runId: string,
    generation: number,
    owner: string,
    /** The run's child, when the caller knows it: whether its journal's wake is wanted. */
    childSessionId?: string,
    /**
     * For a run that had started (a recovered one), a row appended to its child's journal in the start's
     * statement, as the task is for one that had not: the interrupted context, or the task again. Needs
     * `childSessionId`.
     */
    resumeWith?: JournalWrite,
  ): Promise<{
    started: boolean;
    appended: boolean;
    run: SubagentRun | null;
    child?: SessionRow;
    work?: SettlementWork;
    row?: JournalEntry;
    journal?: JournalDelta;
  }>;
  /** Writes the result into the inbox and terminalizes the run, in one transaction; idempotent. */
  settleRun(result: SettledResult, options?: AppendOptions): Promise<{ settled: boolean; resultId: string }>;
  /** Queues a workflow's summary; a second summary for the same call is a no-op returning the first id. */
  enqueueWorkflowSummary(input: NewWorkflowSummary): Promise<{ resultId: string; created: boolean }>;
  /**
   * Stores an open call's progress snapshot (only the progress columns; the host-owned scope column is
   * untouched). Refused (false) for a row no longer open in `generation` or a `seq` not newer than the stored.
   */
  recordRunProgress(
    runId: string,
    principalAccountId: string,
    generation: number,
    seq: number,
    progress: string,
  ): Promise<boolean>;
  /** Ctrl+B: an open foreground call becomes a background call (its result then goes through the inbox). */
  moveRunToBackground(runId: string, principalAccountId: string, generation: number): Promise<boolean>;
  /** Open runs whose parent is `sessionId` (live helpers). */
  openChildRuns(sessionId: string, principalAccountId: string): Promise<SubagentRun[]>;
  /**
   * What a settling session still has to wait for or take, in one snapshot: its open child runs, its
   * pending steers and its unacknowledged results (the counts openChildRuns, pendingSteers and
   * queuedResultIds would give), and whether it has a spilled result. Optional: without it, those are read
   * one by one.
   */
  settlementWork?(sessionId: string, principalAccountId: string): Promise<SettlementWork>;

  // delivery
  /**
   * The ids of results whose delivery is proved by the parent's journal: settled, undiscarded rows carrying
   * details.resultId, before or after a compaction, read in one repeatable-read snapshot.
   */
  settledResultIds(sessionId: string, principalAccountId: string): Promise<string[]>;
  /** Results in the inbox not yet acknowledged, FIFO. */
  queuedResultIds(sessionId: string, principalAccountId: string): Promise<string[]>;
  queuedResults(sessionId: string, principalAccountId: string, limit?: number): Promise<QueuedResult[]>;
  getResult(resultId: string, principalAccountId: string): Promise<QueuedResult>;
  /** The result a run settled with, delivered or not; null while it has none. */
  resultForRun(runId: string, principalAccountId: string): Promise<QueuedResult | null>;
  /**
   * Appends each still-unacknowledged result's journal message and its acknowledgement in one transaction.
   * `message(result)` builds the journal row; a result already acknowledged is skipped (returned in
   * `skipped`), so concurrent deliverers deliver each result once.
   */
  deliverResults(
    sessionId: string,
    principalAccountId: string,
    resultIds: readonly string[],
    message: (result: QueuedResult) => TranscriptMessage,
    options?: AppendOptions,
  ): Promise<{ delivered: DeliveredResult[]; skipped: string[] }>;
  /**
   * `deliverResults` for the session's oldest unacknowledged results (up to `limit`, default 1000), read
   * under its row lock: `results` are the rows delivered, in the order of `delivered`.
   */
  deliverQueuedResults(
    sessionId: string,
    principalAccountId: string,
    message: (result: QueuedResult) => TranscriptMessage,
    options?: AppendOptions & { readonly limit?: number },
  ): Promise<{ delivered: DeliveredResult[]; results: QueuedResult[] }>;

  // steers
  enqueueSteer(childSessionId: string, principalAccountId: string, text: string): Promise<SteerReceipt>;
  pendingSteers(childSessionId: string, principalAccountId: string): Promise<SteerReceipt[]>;
  /** Appends the steers' user messages to the child's journal and marks them delivered, in one transaction. */
  deliverSteers(
    childSessionId: string,
    principalAccountId: string,
    steerIds: readonly string[],
  ): Promise<SteerReceipt[]>;
  dropSteers(childSessionId: string, principalAccountId: string, reason: string): Promise<SteerReceipt[]>;

  // spill
  recordSpill(record: Omit<SpillRecord, "id"> & { principalAccountId: string }): Promise<SpillRecord>;
  /** A spilled output recorded for this session (its own namespace) at exactly `path`, or null. */
  spilledOutput(sessionId: string, principalAccountId: string, path: string): Promise<SpillRecord | null>;
  /**
   * Reclaims a terminal dream child's inherited prefix (the rows its fork copy brought), in bounded
   * batches, once none of its calls is open and each of its results is acknowledged by its parent.
   */
  reclaimInheritedPrefix(
    sessionId: string,
    principalAccountId: string,
    options?: { batch?: number },
  ): Promise<PrefixReclaim>;
  /** Whether any spilled output was recorded for this session, or a call it delegated is still open (one read). */
  hasSpillsOrOpenChildren(sessionId: string, principalAccountId: string): Promise<boolean>;

  // recovery
  /**
   * Deletes unfinished private fork copies (and anything under them); returns their ids. Given `among`, only
   * the private sessions among those ids (and what is under them).
   */
  discardPrivateSessions(among?: readonly string[]): Promise<string[]>;
  /**
   * Takes the recovery lease of open runs (for update skip locked), oldest first. `deadOwnersOnly` (a live
   * takeover) leaves unleased runs and this owner's own alone: only a dead owner's runs are taken.
   */
  claimOpenRuns(owner: string, limit: number, options?: { deadOwnersOnly?: boolean }): Promise<SubagentRun[]>;
  /** Whether any open run or workflow is leased by an owner that holds no lock (one query). */
  orphanedWork(): Promise<{ runs: boolean; workflows: boolean }>;
  /** Holds the advisory lock that tells other processes `owner` is alive; resolve the returned fn to let go. */
  holdOwnerLease(owner: string): Promise<() => Promise<void>>;
  releaseRun(runId: string, owner: string): Promise<void>;
  /** Hands a claimed run back to the next takeover sweep (its lease then names no live owner). */
  handBackRun(runId: string, owner: string): Promise<void>;
  /** Whether a process other than these owners holds an owner lease on the database now. */
  otherOwnersLive(own: readonly string[]): Promise<boolean>;
  /**
   * The next generation of each run that goes on after a restart, in one statement: charged one recovery
   * attempt when it is dispatched after a tool call of unknown outcome, else counted as a free
   * continuation. A run no longer open in its generation is missing from the map.
   */
  nextGenerations(
    runs: readonly { runId: string; generation: number; charged: boolean }[],
  ): Promise<Map<string, { generation: number; recoveryAttempts: number; freeContinuations: number }>>;
  /**
   * Copies the source's settled rows up to `uptoSeq` into a private fork child in batches, each its own
   * transaction, outside any writer transaction of the source.
   */
  copyJournalBranch(
    sourceSessionId: string,
    targetSessionId: string,
    principalAccountId: string,
    uptoSeq: number,
  ): Promise<number>;
  /** Makes a fork copy visible: after this commit, readers see it; before, boot discards it. */
  commitFork(sessionId: string, principalAccountId: string): Promise<void>;
  /** Sessions with a tool_intent that has no toolResult after it (only among `sessionIds` when given). */
  sessionsWithDanglingToolCalls(
    sessionIds?: readonly string[],
  ): Promise<Array<{ sessionId: string; principalAccountId: string }>>;
  /** Sessions with results in their inbox that no journal entry has acknowledged yet. */
  sessionsWithQueuedResults(): Promise<
    Array<{ sessionId: string; principalAccountId: string; kind: "root" | "delegated" }>
  >;
}
