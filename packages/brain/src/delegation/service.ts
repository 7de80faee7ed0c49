import { randomUUID } from "node:crypto";
import type {
  Account,
  DelegationRepository,
  JournalDelta,
  PrefixReclaim,
  SessionRow,
  SettlementWork,
  SubagentRun,
  TranscriptMessage,
} from "@crw/db";
import { catalogPolicyOf, promptToolSummaries } from "../agent/catalog/index.js";
import {
  admitStoredWorkDir,
  captureDelegatedExecutionScope,
  continuationScope,
  type DelegatedExecutionScope,
  type DelegatedTurnIdentity,
  type DelegationAuthority,
  delegatedScopeFromAccess,
  delegatedWorkDir,
  type ExecutionTarget,
  forDelegatedTurn,
  intersectAllow,
  narrowerBoundary,
  PERMISSION_BOUNDARIES,
  type PermissionBoundary,
  parseDelegatedExecutionScope,
  readOnlyContinuationScope,
  unionDeny,
  type WorkDirPlacement,
  type WorkDirPolicy,
} from "../scope/index.js";
import { CapturedWrites, pausedError, type RestartCheckpoint, RestartCheckpointError } from "./checkpoint.js";
import { type DelegationEvent, drainResults } from "./delivery.js";
import { DelegationError, toError } from "./errors.js";
import { isolatedPlacement, isolationKey, type LandedWork, landIsolatedWork } from "./isolation.js";
import { forkContextEnd } from "./journalReads.js";
import { Notifier } from "./notifier.js";
import {
  assertInsideParentProject,
  assertNotHostPrivate,
  childCwd,
  projectBoundOf,
  rootPlacement,
  workDirPolicyFor,
} from "./placement.js";
import { type ProgressPace, type ProgressPublisher, RunProgressJob } from "./progress.js";
import { type PromptTool, systemPromptFor } from "./prompt.js";
import { readSubagent } from "./readSubagent.js";
import { type MutatingTool, offeredTools } from "./scopedTools.js";
import { DelegatedSettlement, type InboxLook } from "./settlement.js";
import type { PreparedCompletion } from "./spill.js";
import { spillReadTool } from "./spillRead.js";
import { StallWatchdog } from "./stallWatchdog.js";
import { delegationTools } from "./tools.js";
import { NO_PROGRESS, type ProgressSink, type TurnOutcome, type TurnTool } from "./turn.js";
import { SessionTurns } from "./turns.js";
import type {
  ContinueArgs,
  DelegateArgs,
  DelegationCompletion,
  DelegationReceipt,
  DelegationServiceOptions,
  DreamArgs,
  PendingResultDrainOutcome,
} from "./types.js";
import { type ForkPrefixDiagnostics, forkPrefixDiagnostics } from "./usage.js";

/** Whether a foreground call was moved to the background, and why not. */
type BackgroundMove =
  | { readonly ok: true }
  | { readonly ok: false; readonly reason: string; readonly code: string };

/** How long a foreground call's child may show no progress before its caller is let go. */
const DEFAULT_STALL_AFTER_MS = 10 * 60_000;

export type {
  ContinueArgs,
  DelegateArgs,
  DelegationCompletion,
  DelegationReceipt,
  DelegationServiceOptions,
  DreamArgs,
  PendingResultDrainOutcome,
} from "./types.js";

/** A session's durable delegated scope, parsed (null for a session without one). */
function scopeOf(session: SessionRow): DelegatedExecutionScope | null {
  return session.scope ? parseDelegatedExecutionScope(session.scope) : null;
}

/**
 * Whether a child's context may be continued. A host-owned dream run is one-shot: terminal, it is never
 * continued (its inherited prefix may be reclaimed); every ordinary child stays continuable.
 */
export function assertForkContextAvailable(child: SessionRow): void {
  const scope = scopeOf(child);
  if (scope?.dream) {
    throw new DelegationError("invalid_input", "a memory-dreaming run cannot be continued", {
      childSessionId: child.id,
      dreamRunId: scope.dream.runId,
    });
  }
}

/**
 * A host-owned dream child has no addressable conversation: nobody prompts it, continues it or steers it;
 * its own output stays readable through the ordinary ownership guard (readSubagent).
 */
export function assertAddressable(session: SessionRow): void {
  if (scopeOf(session)?.dream) {
    throw new DelegationError("invalid_input", "a memory-dreaming run has no addressable conversation", {
      sessionId: session.id,
    });
  }
}

/**
 * The delegation core: Delegate, DelegateContinue and DelegateRead, the settlement of a child's call and the
 * exactly-once delivery of its result, over a DelegationRepository and a SessionTurnRunner. It keeps no truth
 * in memory: what ran, what is owed and what was delivered is in the rows; in-memory state only serializes
 * this process's own turns and wakes its own waiters.
 */
export class DelegationService implements RestartCheckpoint {
  readonly repo: DelegationRepository;
  /** Every journal write and result publication of this process (the restart checkpoint drains them). */
  readonly writes = new CapturedWrites();
  readonly turns: SessionTurns;
  readonly notifier = new Notifier();
  readonly owner: string;
  readonly options: DelegationServiceOptions;
  readonly settlement: DelegatedSettlement;
  readonly #background = new Set<Promise<unknown>>();
  readonly #foreground = new Map<
    string,
    { run: SubagentRun; job: RunProgressJob; release: (stalledMs?: number) => void }
  >();
  readonly #jobs = new Set<RunProgressJob>();
  /** An idle parent's row being read for its follow-up: results that arrive meanwhile join that read. */
  readonly #parentReads = new Map<string, Promise<void>>();
  /**
   * Root parents read here. A session's kind and driver never change, and the follow-up reads the row
   * afresh before its turn, so a result for a known root parent is delivered without reading it first.
   */
  readonly #rootParents = new Map<string, SessionRow>();
  /** System prompts this process saw stored by a turn's first write (a stored prompt never changes). */
  readonly #storedPrompts = new Map<string, string>();
  #releaseLease: (() => Promise<void>) | undefined;
  #pause: Promise<void> | undefined;

  constructor(options: DelegationServiceOptions) {
    this.options = options;
    this.repo = options.repo;
    this.owner = options.owner ?? `crw-${process.pid}-${randomUUID()}`;
    this.turns = new SessionTurns(options.repo, options.runner, this.writes);
    this.settlement = new DelegatedSettlement(this);
  }

  /** Announces this process as a live owner of the runs it starts (see claimOpenRuns). */
  async start(): Promise<void> {
    this.#releaseLease ??= await this.repo.holdOwnerLease(this.owner);
  }

  async close(): Promise<void> {
    await this.whenIdle();
    await this.#releaseLease?.();
    this.#releaseLease = undefined;
  }

  /**
   * The restart checkpoint: from now on no new delegation, continuation, prompt, follow-up or turn is
   * admitted and no new journal write is taken; every write and result publication already captured
   * commits (a finished tool result queued behind an in-flight write included) and every call's progress
   * publication drains. Model and tool turns are not waited for: their calls stay open in the rows and boot
   * recovery continues them. Idempotent; rejects with `RestartCheckpointError` if anything drained failed.
   */
  pauseForRestart(): Promise<void> {
    this.#pause ??= this.#checkpoint();
    return this.#pause;
  }

  /** Whether `pauseForRestart` began. */
  get paused(): boolean {
    return this.writes.closed;
  }

  async #checkpoint(): Promise<void> {
    const jobs = [...this.#jobs];
    const before = jobs.map((job) => job.failures.length);
    const [writes] = await Promise.allSettled([
      this.writes.drain(),
      Promise.all(jobs.map((job) => job.drain())),
    ]);
    const failures: Error[] = [];
    if (writes.status === "rejected") {
      const reason = writes.reason as unknown;
      if (reason instanceof RestartCheckpointError) failures.push(...reason.failures);
      else failures.push(toError(reason));
    }
    jobs.forEach((job, i) => {
      failures.push(...job.failures.slice(before[i]));
    });
    this.emit({ type: "delegation.paused", failures: failures.length });
    if (failures.length > 0) throw new RestartCheckpointError(failures);
  }

  #captured<T>(what: string, write: () => Promise<T>): Promise<T> {
    return this.writes.capture(what, write);
  }

  #admit(what: string): void {
    if (this.writes.closed) throw pausedError(what);
  }

  emit(event: DelegationEvent): void {
    this.options.onEvent?.(event);
  }

  /** Resolves when no background work this process started is left (bounded by that work's own bounds). */
  async whenIdle(): Promise<void> {
    while (this.#background.size > 0) await Promise.allSettled([...this.#background]);
  }

  track<T>(work: Promise<T>): void {
    const p = work.catch((e: unknown) => {
      const error = toError(e);
      const code = (error as { code?: unknown }).code;
      this.emit({
        type: "delegation.background_failed",
        error: error.message,
        ...(typeof code === "string" ? { code } : {}),
      });
    });
    this.#background.add(p);
    void p.finally(() => this.#background.delete(p));
  }

  // ---- authority and scope

  /**
   * The current access of a session: the live account grant (`tool_allow`, `tool_deny` and the settings'
   * permission boundary, as currentDelegatedAccess reads them), narrowed by the session's own durable scope.
   */
  async authorityFor(
    session: SessionRow,
    live?: Account,
  ): Promise<DelegationAuthority & { target: ExecutionTarget }> {
    // `live`: the account read with the session in one snapshot (getSessionWithAccount)
    const account = live ?? (await this.repo.getAccount(session.principalAccountId));
    const own = scopeOf(session);
    const allow = intersectAllow(account.toolAllow ?? undefined, own?.tools.allow);
    const boundary = accountBoundary(account.permissionSettings);
    return {
      accountId: account.id,
      operator: (account.isOwner || account.isAdministrator) && (own ? own.operator : true),
      tools: { ...(allow ? { allow } : {}), deny: unionDeny(account.toolDeny, own?.tools.deny) },
      ...(own
        ? { permissionBoundary: narrowerBoundary(own.permissionBoundary, boundary), readOnly: own.readOnly }
        : boundary
          ? { permissionBoundary: boundary }
          : {}),
      target: own?.target ?? { kind: "host", ref: null },
    };
  }

  // ---- root sessions

  /**
   * A root session; with `cwd`, placed in that working directory (see `rootPlacement` for who may use
   * which), its placement captured once as the session's durable scope. Its turns then get the coding tools.
   */
  async createRootSession(
    principalAccountId: string,
    model: string,
    options: { cwd?: string } = {},
  ): Promise<SessionRow> {
    if (!options.cwd) return this.repo.createRootSession(principalAccountId, model);
    return this.repo.createRootSession(
      principalAccountId,
      model,
      await this.rootScopeFor(principalAccountId, options.cwd),
    );
  }

  /** The durable scope of a root session placed in `cwd` (refused where this account may not work). */
  async rootScopeFor(principalAccountId: string, cwd: string): Promise<string> {
    const account = await this.repo.getAccount(principalAccountId);
    const placement = await rootPlacement(account, cwd, this.options.projects);
    assertNotHostPrivate(placement.workDir, this.options.hostPrivate);
    const operator = account.isOwner || account.isAdministrator;
    return captureDelegatedExecutionScope(
      delegatedScopeFromAccess({
        accountId: account.id,
        operator,
        target: placement.target,
        workDir: placement.workDir,
        projectRef: placement.projectRef,
      }),
    );
  }

  /**
   * A root session's own scope for a turn: its stored working directory re-proved now (it must still exist
   * and belong to the same project), its tools bounded by the account's live grant (`tool_allow`,
   * `tool_deny`) exactly as a child's are (see `authorityFor`). The grant is read at every turn, never
   * stored: a grant changed later applies to the next turn. A root without a scope of its own, of an
   * account without a grant, has none (nothing to bound).
   */
  async #rootScope(session: SessionRow): Promise<DelegatedExecutionScope | null> {
    if (session.kind !== "root") return null;
    const stored = scopeOf(session);
    const own = stored?.workDir
      ? { ...stored, workDir: await admitStoredWorkDir(stored, this.options.projects?.projectForPath) }
      : stored;
    const account = await this.repo.getAccount(session.principalAccountId);
    if (account.toolAllow === null && account.toolDeny.length === 0) return own;
    const base =
      own ??
      parseDelegatedExecutionScope(
        captureDelegatedExecutionScope(
          delegatedScopeFromAccess({
            accountId: account.id,
            operator: account.isOwner || account.isAdministrator,
            target: { kind: "host", ref: null },
          }),
        ),
      );
    const allow = intersectAllow(base.tools.allow, account.toolAllow ?? undefined);
    return {
      ...base,
      tools: { ...(allow ? { allow } : {}), deny: unionDeny(base.tools.deny, account.toolDeny) },
    };
  }

  /** One user turn of a root session. Results that arrive while it streams join it after each tool round. */
  async prompt(
    sessionId: string,
    principalAccountId: string,
    text: string,
    options: { readOnly?: boolean; progress?: ProgressSink } = {},
  ): Promise<TurnOutcome> {
    this.#admit("a prompt");
    const session = await this.repo.getSession(sessionId, principalAccountId);
    assertAddressable(session);
    if (session.driver === "client") {
      throw new DelegationError(
        "invalid_input",
        "a client-driven session takes no prompt: its client is its model",
        {
          sessionId,
        },
      );
    }
    const scope = await this.#rootScope(session);
    const outcome = await this.turns.exclusive(session.id, () =>
      this.sessionTurn(session, [{ body: { type: "message", message: { role: "user", content: text } } }], {
        readOnly: options.readOnly ?? false,
        progress: options.progress ?? NO_PROGRESS,
        scope,
      }),
    );
    this.#afterIdle(session);
    return outcome;
  }

  async sessionTurn(
    session: SessionRow,
    input: Parameters<SessionTurns["runLocked"]>[0]["input"],
    opts: {
      readOnly: boolean;
      progress: ProgressSink;
      scope: DelegatedExecutionScope | null;
      /** What the drain just before this turn saw of the session's inbox. */
      inbox?: InboxLook;
      /** The session's whole journal, when the caller has just read or written all of it. */
      journal?: JournalDelta;
      /** Aborts the turn wherever it is: queued for a runner, in a runner, or in this process. */
      signal?: AbortSignal;
    },
  ): Promise<TurnOutcome> {
    this.#admit("a new turn");
    const own = this.options.tools?.(session) ?? [];
    const spillRead = (await this.#readsSpills(session, own, opts.inbox))
      ? [spillReadTool(this.repo, session)]
      : [];
    // The prompt and the request offer only what the turn's scope can let run (scopedTools checks each call).
    const tools = offeredTools(
      [...delegationTools(this, session, opts.readOnly), ...spillRead, ...own],
      opts.scope,
    );
    const given = this.options.systemPrompt?.(session, opts.scope);
    const prompt =
      given !== undefined
        ? { text: given, stored: true }
        : await this.#systemPromptOf(session, () => this.#promptTools(tools, opts));
    return this.turns.runLocked({
      identity: await this.#identityFor(session),
      session,
      input,
      tools,
      scope: opts.scope,
      readOnly: opts.readOnly,
      systemPrompt: prompt.text,
      ...(prompt.stored ? {} : { promptStored: (stored: string) => this.#notePrompt(session.id, stored) }),
      progress: opts.progress,
      drainSteering: () => this.drainInto(session),
      ...(opts.journal ? { journal: opts.journal } : {}),
      ...(opts.signal ? { signal: opts.signal } : {}),
    });
  }

  /**
   * A session reads its own spilled results with Read (unless the host gives it a Read of its own): from
   * the turn on which one may reach it, i.e. once it has a spilled result or while a child of it is open
   * (a result can arrive, spilled, at any tool round). Other sessions' tool lists stay as they were.
   */
  async #readsSpills(session: SessionRow, own: readonly MutatingTool[], inbox?: InboxLook): Promise<boolean> {
    if (own.some((t) => t.name === "Read")) return false;
    // The drain that starts this turn read it in its own snapshot of the inbox: not read again.
    if (inbox?.spillsReachable !== undefined) return inbox.spillsReachable;
    return this.repo.hasSpillsOrOpenChildren(session.id, session.principalAccountId);
  }

  /**
   * IdentityResolver.forDelegatedTurn for every turn, from the rows as they are now: the parent's facts are
   * read fresh (the request's parent id is always forwarded), so a continuation or a recovered turn keeps a
   * dream's memory identity without any wrapper, and loses it as soon as the parent no longer proves it.
   */
  async #identityFor(session: SessionRow): Promise<DelegatedTurnIdentity> {
    if (session.kind === "root" || !session.scope || !session.parentSessionId) {
      return { principalAccountId: session.principalAccountId };
    }
    const scope = parseDelegatedExecutionScope(session.scope);
    // Only a dream's memory identity depends on the parent's facts (see forDelegatedTurn); without a dream
    // the turn acts for its scope's account and the parent is not read.
    if (!scope.dream) return { principalAccountId: scope.accountId };
    const parent = await this.repo.getSession(session.parentSessionId, session.principalAccountId);
    return forDelegatedTurn(scope, {
      sessionId: parent.id,
      accountId: parent.principalAccountId,
      kind: parent.kind,
      continuation: false,
      channelId: null,
    });
  }

  /**
   * The session's system prompt, composed once at its first turn and stored with it: later turns,
   * continuations and recovered turns reuse the same bytes. Composition reads the session's permanent scope
   * (never a turn's read-only clamp); a fork takes its parent's prompt byte for byte.
   */
  #notePrompt(sessionId: string, stored: string): void {
    if (this.#storedPrompts.size >= 10_000) this.#storedPrompts.clear();
    this.#storedPrompts.set(sessionId, stored);
  }

  /**
   * The session's system prompt, and whether it is stored. A stored prompt never changes (first writer
   * wins): one in hand, or one this process saw stored, is the session's for good. Without one, the prompt
   * is composed from durable state and the turn's first journal write stores it: only that turn runs on the
   * session meanwhile (its lock here, its run's lease across processes), and a turn that wrote nothing
   * leaves nothing that depended on it.
   */
  async #systemPromptOf(
    session: SessionRow,
    toolsOf: () => readonly PromptTool[],
  ): Promise<{ text: string; stored: boolean }> {
    if (session.systemPrompt !== null) return { text: session.systemPrompt, stored: true };
    const seen = this.#storedPrompts.get(session.id);
    if (seen !== undefined) return { text: seen, stored: true };
    const tools = toolsOf();
    const parentOf = (s: SessionRow) => this.repo.getSession(s.parentSessionId ?? "", s.principalAccountId);
    const own = scopeOf(session);
    const rootOf = async (ref: string) => (await this.options.projects?.rootOf?.(ref))?.root;
    let composed: string;
    if (own?.fork && session.parentSessionId) {
      const parent = await parentOf(session);
      composed = parent.systemPrompt ?? (await systemPromptFor(parent, null, tools, parentOf, rootOf));
    } else {
      composed = await systemPromptFor(session, null, tools, parentOf, rootOf);
    }
    return { text: composed, stored: false };
  }

  /**
   * The tools the composing turn's prompt describes: with a catalog policy (the option, else the runner's
   * own), the plan of that turn's request (a deferred tool is left to ToolSearch); without one, every tool.
   */
  #promptTools(
    tools: readonly TurnTool[],
    opts: { readOnly: boolean; scope: DelegatedExecutionScope | null },
  ): readonly PromptTool[] {
    const policy =
      this.options.catalogPolicy === undefined
        ? catalogPolicyOf(this.options.runner)
        : this.options.catalogPolicy;
    if (!policy) return tools;
    return promptToolSummaries(
      { tools, scope: opts.scope, workDir: opts.scope?.workDir ?? null, readOnly: opts.readOnly },
      policy,
    );
  }

  /** Journals (and acknowledges) what arrived for a session: its queued results, then a child's text steers. */
  async drainInto(
    session: SessionRow,
    look?: InboxLook,
    known?: SettlementWork,
  ): Promise<TranscriptMessage[]> {
    // A child's inbox is most often empty at a tool round: one count of both says so in one read. The
    // same snapshot tells the turn this drain starts whether a spilled result may reach it.
    if (session.kind === "delegated" && this.repo.settlementWork) {
      const waiting = known ?? (await this.repo.settlementWork(session.id, session.principalAccountId));
      if (look) look.spillsReachable = waiting.spills || waiting.openChildRuns > 0;
      if (waiting.pendingSteers === 0 && waiting.queuedResults === 0) return [];
    }
    const results = await drainResults(this.deliveryDeps(), session.id, session.principalAccountId);
    if (session.kind !== "delegated") return results;
    const steers = await this.repo.pendingSteers(session.id, session.principalAccountId);
    const delivered = await this.repo.deliverSteers(
      session.id,
      session.principalAccountId,
      steers.map((s) => s.id),
    );
    return [...results, ...delivered.map((s): TranscriptMessage => ({ role: "user", content: s.text }))];
  }

  /** What delivering a result into a session needs (also a client's take of its results). */
  deliveryDeps() {
    return {
      repo: this.repo,
      notifier: this.notifier,
      emit: (e: DelegationEvent) => this.emit(e),
      ...(this.options.onResultDelivered ? { onResultDelivered: this.options.onResultDelivered } : {}),
    };
  }

  /**
   * A result entered `parentSessionId`'s inbox. A streaming parent takes it at its next tool round; a
   * settling child's drain is woken; an idle root parent gets one batched follow-up turn.
   */
  async resultQueued(parentSessionId: string, principalAccountId: string, resultId: string): Promise<void> {
    this.emit({ type: "delegation.result_steered", parentSessionId, resultId });
    this.notifier.notify(parentSessionId);
    // A parent with a turn here is followed up when that turn ends (prompt and followUp both look again):
    // #afterIdle would do nothing now, so its row is not read for it.
    if (this.turns.isBusy(parentSessionId)) return;
    const known = this.#rootParents.get(parentSessionId);
    if (known?.principalAccountId === principalAccountId) return this.#afterIdle(known);
    // Results of one batch settle together: the parent's row is read once, and the follow-up it starts
    // drains every result committed before its drain runs (each of them was committed before its call here).
    const reading = this.#parentReads.get(parentSessionId);
    if (reading) return reading;
    const read = this.repo
      .getSession(parentSessionId, principalAccountId)
      .then((parent) => {
        if (parent.kind !== "root") return;
        if (this.#rootParents.size >= 10_000) this.#rootParents.clear();
        this.#rootParents.set(parent.id, parent);
        this.#afterIdle(parent);
      })
      .finally(() => this.#parentReads.delete(parentSessionId));
    this.#parentReads.set(parentSessionId, read);
    return read;
  }

  /**
   * A workflow's summary is in `parentSessionId`'s inbox (the workflow engine wrote it): delivered like any
   * result, and when the parent is a child whose call waits on helpers, its result turn starts now instead
   * of after the helpers have settled.
   */
  async workflowSummaryQueued(
    parentSessionId: string,
    principalAccountId: string,
    resultId: string,
  ): Promise<void> {
    await this.resultQueued(parentSessionId, principalAccountId, resultId);
    this.settlement.resultTurnFor(parentSessionId);
  }

  /** A root session's turn ended outside `prompt` (a host-driven turn): deliver what waits for it. */
  parentIdle(session: SessionRow): void {
    this.#afterIdle(session);
  }

  /** After a root session's turn, or a result for it: if results wait and no turn holds it, follow up once. */
  #afterIdle(session: SessionRow): void {
    // Pausing: the results stay queued; boot recovery follows the idle parent up. A client-driven session's
    // results wait for its client to take them.
    if (this.turns.isBusy(session.id) || this.paused || session.driver === "client") return;
    this.track(this.followUp(session));
  }

  /**
   * The idle parent's batched follow-up: every queued result is journaled and acknowledged first, then one
   * turn answers them all. A failed answer leaves them delivered: nothing durable is requeued.
   */
  async followUp(session: SessionRow, lookAgain = true): Promise<TurnOutcome | undefined> {
    if (session.driver === "client") return undefined;
    const outcome = await this.turns.exclusive(session.id, async () => {
      if (this.paused) return undefined;
      const delivered = await this.writes.capture(
        "a follow-up delivery",
        () => drainResults(this.deliveryDeps(), session.id, session.principalAccountId),
        session.id,
      );
      if (delivered.length === 0) return undefined;
      // The row as it is now (its stored prompt, its model): the caller's copy may be older than this turn.
      const current = await this.repo.getSession(session.id, session.principalAccountId);
      return this.sessionTurn(current, [], {
        readOnly: false,
        progress: NO_PROGRESS,
        scope: await this.#rootScope(current),
      });
    });
    // A result that committed after this drain read the inbox, while the turn lock was still held, saw a
    // busy parent and left it to the lock's holder: look again now that the lock is let go. After a follow-up
    // that delivered nothing, once only (a result that stays queued, e.g. while paused, is not looped on).
    if (outcome === undefined && !lookAgain) return outcome;
    const more = await this.repo.queuedResultIds(session.id, session.principalAccountId);
    if (more.length === 0) return outcome;
    if (outcome !== undefined) this.#afterIdle(session);
    else if (!this.paused) this.track(this.followUp(session, false));
    return outcome;
  }

  // ---- Delegate / DelegateContinue / DelegateRead

  async delegate(args: DelegateArgs): Promise<DelegationReceipt> {
    this.#admit("Delegate");
    const { session: parent, account } = await this.repo.getSessionWithAccount(
      args.parentSessionId,
      args.principalAccountId,
    );
    const authority = await this.authorityFor(parent, account);
    const readOnly = args.readOnly === true || args.callerReadOnly === true || authority.readOnly === true;
    const shared = await this.placeUnder(parent, args.workDir, authority);
    const isolated =
      args.isolation === "worktree"
        ? await isolatedPlacement(
            shared,
            isolationKey(parent.id, args.toolCallId),
            this.options.worktreesDir,
            await this.#workDirPolicy(authority),
          )
        : null;
    const placement = isolated?.placement ?? shared;
    const scope = captureDelegatedExecutionScope(
      delegatedScopeFromAccess({
        accountId: parent.principalAccountId,
        operator: authority.operator ?? false,
        target: placement?.target ?? authority.target,
        ...(placement ? { workDir: placement.workDir, projectRef: placement.projectRef } : {}),
        ...(args.tools ? { tools: args.tools } : {}),
        ...(readOnly ? { readOnly: true, permissionBoundary: "read-only" as const } : {}),
        ...(args.role ? { role: args.role } : {}),
        ...(args.context ? { context: args.context } : {}),
        ...(args.fork ? { fork: true } : {}),
      }),
      authority,
    );
    const { run, child, created } = await this.#captured("Delegate", () =>
      this.repo.createDelegation({
        parentSessionId: parent.id,
        principalAccountId: parent.principalAccountId,
        toolCallId: args.toolCallId,
        task: args.task,
        mode: args.mode,
        model: args.fork ? parent.model : (args.model ?? parent.model),
        scope,
        ...(args.fork ? { fork: { fromSessionId: parent.id } } : {}),
        ...(isolated ? { worktree: isolated.worktree } : {}),
      }),
    );
    if (args.fork && created)
      await this.#captured("a fork copy", () => this.#copyForkContext(parent, child, args.toolCallId));
    args.progress?.({ type: "session", sessionId: child.id, parentSessionId: parent.id });
    return this.#dispatch(run, args.mode, args.progress, { parent, authority });
  }

  /**
   * Where work of `parent` (a child, a workflow or one of its nodes) is placed for a requested `cwd`:
   * relative to the parent's directory, the parent's own when absent, through delegatedWorkDir under the
   * live policy of the parent's authority, and never outside the parent's project. Null: no directory.
   */
  async placeUnder(
    parent: SessionRow,
    requested: string | null | undefined,
    authority?: DelegationAuthority & { target: ExecutionTarget },
  ): Promise<WorkDirPlacement | null> {
    const parentScope = scopeOf(parent);
    const cwd = childCwd(parentScope, requested);
    if (!cwd) return null;
    const placement = await delegatedWorkDir(cwd, await this.workDirPolicyOf(parent, authority));
    await this.assertInsideProjectOf(parent, placement);
    return placement;
  }

  /** Merges an isolated child's committed work into the branch it started from (see `landIsolatedWork`). */
  async land(childSessionId: string, principalAccountId: string): Promise<LandedWork> {
    const child = await this.repo.getSession(childSessionId, principalAccountId);
    return landIsolatedWork(this.repo, child);
  }

  /**
   * Refuses a placement of work under `session` outside its project or in the host's own data. A Delegate
   * child's and a workflow node's placements pass this one check, in this order, so a directory both
   * refuse is refused for the same reason.
   */
  async assertInsideProjectOf(session: SessionRow, placement: WorkDirPlacement): Promise<void> {
    await assertInsideParentProject(scopeOf(session), placement, this.options.projects);
    assertNotHostPrivate(placement.workDir, this.options.hostPrivate);
  }

  /**
   * Where `session` reads its project's files (a workflow definition it names): the bound its work stays
   * inside, relative paths against its own directory. Null: no directory on this host to read from.
   */
  async projectFilesOf(session: SessionRow): Promise<{ root: string; cwd: string } | null> {
    const scope = scopeOf(session);
    const root = await projectBoundOf(scope, this.options.projects);
    return root !== null && scope?.workDir ? { root, cwd: scope.workDir } : null;
  }

  /** Refuses a directory that holds, or lies inside, the host's own data (see `assertNotHostPrivate`). */
  assertNotHostPrivate(dir: string): void {
    assertNotHostPrivate(dir, this.options.hostPrivate);
  }

  /** The live placement policy for work of `session` (its workflow nodes' `cwd` among them). */
  async workDirPolicyOf(
    session: SessionRow,
    authority?: DelegationAuthority & { target: ExecutionTarget },
  ): Promise<WorkDirPolicy> {
    return this.#workDirPolicy(authority ?? (await this.authorityFor(session)));
  }

  #workDirPolicy(authority: { operator?: boolean; target: ExecutionTarget }): Promise<WorkDirPolicy> {
    return workDirPolicyFor(
      authority,
      this.options.projects,
      (ref) =>
        new DelegationError("invalid_input", `project ${ref} is not registered on this host`, {
          projectRef: ref,
        }),
    );
  }

  /**
   * A fork's context: the parent's settled journal up to (not including) the assistant message that asked
   * for this fork, copied in batches outside any writer transaction of the parent; the copy becomes visible
   * only when complete. A crash before that leaves a private copy that boot discards.
   */
  async #copyForkContext(parent: SessionRow, child: SessionRow, toolCallId: string): Promise<void> {
    const upto = await forkContextEnd(this.repo, parent.id, parent.principalAccountId, toolCallId);
    if (upto > 0) await this.repo.copyJournalBranch(parent.id, child.id, parent.principalAccountId, upto);
    await this.repo.commitFork(child.id, parent.principalAccountId);
  }

  /**
   * Runs an admitted call as its own job. The job snapshots the call's progress and publishes it in order;
   * it drains that publication before the result is settled, for a foreground return and a background
   * completion alike. A foreground caller waits for the result unless Ctrl+B (`moveToBackground`) lets it go.
   */
  async #dispatch(
    run: SubagentRun,
    mode: "foreground" | "background",
    progress?: ProgressSink,
    known?: { parent: SessionRow; authority: DelegationAuthority },
  ): Promise<DelegationReceipt> {
    const childSessionId = run.childSessionId ?? "";
    const job = new RunProgressJob(
      { ...run, mode },
      this.#publisherFor(run),
      (error) =>
        this.emit({
          type: "delegation.progress_failed",
          runId: run.id,
          seq: error.seq,
          code: error.code,
          error: error.message,
        }),
      this.#progressPace(),
    );
    const watchdog = mode === "foreground" ? this.#stallWatchdog(run) : null;
    const sink: ProgressSink = (event) => {
      // the child's own activity renews the watchdog, its result turns' too; identity events are none
      if (event.type !== "session") watchdog?.renew();
      progress?.(event);
      job.sink(event);
    };
    this.#jobs.add(job);
    const execution = this.executeRun(run, {
      progress: sink,
      beforeSettle: () => job.drainForSettlement(),
      unsettledProgress: (snapshot) => job.publishUnsettled(snapshot),
      ...(known ? { known } : {}),
    });
    // A call that ends without settling (it failed) still publishes what its job was holding back.
    const ended = () => {
      this.#jobs.delete(job);
      void job.drain();
    };
    void execution.then(ended, ended);
    if (mode === "background") {
      this.track(execution);
      return { kind: "started", runId: run.id, childSessionId };
    }
    let release!: (stalledMs?: number) => void;
    // let go to the background: by Ctrl+B, or by the stall watchdog with the silence it saw
    const released = new Promise<{ readonly stalledMs?: number }>((resolve) => {
      release = (stalledMs) => resolve(stalledMs ? { stalledMs } : {});
    });
    this.#foreground.set(run.id, { run, job, release });
    watchdog?.start();
    let resultId: string;
    try {
      const first = await Promise.race([execution, released]);
      if (typeof first !== "string") {
        this.track(execution);
        return { kind: "started", runId: run.id, childSessionId, ...first };
      }
      resultId = first;
    } finally {
      watchdog?.stop();
      this.#foreground.delete(run.id);
    }
    const result = await this.repo.getResult(resultId, run.principalAccountId);
    return {
      kind: "result",
      runId: run.id,
      childSessionId,
      resultId,
      outcome: result.outcome,
      body: result.body,
    };
  }

  /**
   * A foreground call whose child stays silent past the stall bound is let go as Ctrl+B lets it go: the
   * parent's turn goes on, and the result arrives through its inbox, exactly once either way.
   */
  #stallWatchdog(run: SubagentRun): StallWatchdog | null {
    const afterMs = this.options.stallAfterMs ?? DEFAULT_STALL_AFTER_MS;
    if (afterMs <= 0) return null;
    return new StallWatchdog(afterMs, async (silentMs) => {
      if (!this.#foreground.has(run.id)) return true; // it ended meanwhile
      const moved = await this.#letGo(run.id, run.principalAccountId, silentMs);
      this.emit({
        type: "delegation.stalled",
        runId: run.id,
        silentMs,
        moved: moved.ok,
        ...(moved.ok ? {} : { error: moved.reason }),
      });
      return moved.ok;
    });
  }

  /**
   * Ctrl+B for a foreground call this process waits on: the row becomes a background call and the job's
   * background snapshot is published, both awaited, and only then is the foreground waiter let go (its
   * Delegate returns "started"; the result comes through the inbox). A failed write is diagnosed and leaves
   * the waiter attached; the result is still delivered exactly once (the journal proves which way).
   */
  moveToBackground(runId: string, principalAccountId: string): Promise<BackgroundMove> {
    return this.#letGo(runId, principalAccountId);
  }

  /**
   * Ctrl+B for a session: every foreground call of `sessionId` this process waits on is moved to the
   * background (see moveToBackground), each answered on its own.
   */
  async moveForegroundOf(
    sessionId: string,
    principalAccountId: string,
  ): Promise<{ runId: string; moved: BackgroundMove }[]> {
    const waited = [...this.#foreground.values()]
      .map((w) => w.run)
      .filter((r) => r.parentSessionId === sessionId && r.principalAccountId === principalAccountId);
    return Promise.all(
      waited.map(async (r) => ({ runId: r.id, moved: await this.#letGo(r.id, principalAccountId) })),
    );
  }

  /** Ctrl+B's move, also the stall watchdog's (which tells the waiter the silence it saw). */
  async #letGo(runId: string, principalAccountId: string, stalledMs?: number): Promise<BackgroundMove> {
    const waiter = this.#foreground.get(runId);
    if (!waiter || waiter.run.principalAccountId !== principalAccountId) {
      return {
        ok: false,
        code: "not_found",
        reason: "no foreground call of this account waits on that run here",
      };
    }
    try {
      const moved = await this.#captured("Ctrl+B", () =>
        this.repo.moveRunToBackground(runId, principalAccountId, waiter.run.generation),
      );
      if (!moved) return { ok: false, code: "not_open", reason: "the call is no longer open" };
      await this.#captured("Ctrl+B", () => waiter.job.background());
    } catch (e) {
      const error = toError(e);
      const raw = (error as { code?: unknown }).code;
      const code = typeof raw === "string" ? raw : "background_not_persisted";
      this.emit({
        type: "delegation.progress_failed",
        runId,
        seq: (error as { seq?: number }).seq ?? 0,
        code,
        error: error.message,
      });
      return { ok: false, code, reason: error.message };
    }
    waiter.release(stalledMs);
    return { ok: true };
  }

  /**
   * How a call's progress is paced: a host's own publication gets every snapshot as taken; the run row's
   * columns at most one write an interval, the last one with the call's settlement.
   */
  #progressPace(): ProgressPace | undefined {
    if (this.options.publishProgress) return undefined;
    return { intervalMs: this.options.progressIntervalMs ?? 1000, foldable: true };
  }

  /** The host's progress publication, by default the run row's progress columns (nothing else is written). */
  #publisherFor(run: SubagentRun): ProgressPublisher {
    const custom = this.options.publishProgress;
    if (custom) return custom;
    return async (snapshot) => {
      await this.repo.recordRunProgress(
        run.id,
        run.principalAccountId,
        run.generation,
        snapshot.seq,
        JSON.stringify(snapshot),
      );
    };
  }

  /**
   * DelegateContinue. With the child busy: a planning (read-only) caller must wait; a Build caller must wait
   * for a read-only call, and otherwise steers its text into the open call. With the child free: a
   * read-only caller's continuation is bound to the new row as `read_only_scope` before dispatch.
   */
  async continueSubagent(args: ContinueArgs): Promise<DelegationReceipt> {
    this.#admit("DelegateContinue");
    if (args.callerReadOnly && args.writeAccess) {
      throw new DelegationError(
        "write_access_refused",
        "write access cannot be granted from a read-only turn",
        {
          childSessionId: args.childSessionId,
        },
      );
    }
    if (args.callerReadOnly && args.promote) {
      throw new DelegationError("write_access_refused", "a child cannot be promoted from a read-only turn", {
        childSessionId: args.childSessionId,
      });
    }
    if (args.model !== undefined && (args.model.length === 0 || args.model.length > 200)) {
      throw new DelegationError("invalid_input", "a continuation's model is a name of 1 to 200 characters", {
        childSessionId: args.childSessionId,
      });
    }
    const child = await this.repo.getChildSession(
      args.parentSessionId,
      args.childSessionId,
      args.principalAccountId,
    );
    assertForkContextAvailable(child);
    const open = await this.repo.openRunForChild(child.id, args.principalAccountId);
    if (open && (args.promote || args.model !== undefined)) {
      // A model or a promotion belongs to a call of its own; it never rides on a steer into a running one.
      throw new DelegationError("wait_required", "the child is working; a model change or promotion waits", {
        childSessionId: child.id,
        runId: open.id,
      });
    }
    if (open) {
      if (args.callerReadOnly) {
        throw new DelegationError(
          "wait_required",
          "the child is working; a planning turn waits for it to finish",
          {
            childSessionId: child.id,
            runId: open.id,
          },
        );
      }
      if (open.readOnlyScope) {
        throw new DelegationError(
          "wait_required",
          "the child is running a read-only call; wait for it to finish",
          {
            childSessionId: child.id,
            runId: open.id,
          },
        );
      }
      const receipt = await this.#captured("a steer", () =>
        this.repo.enqueueSteer(child.id, args.principalAccountId, args.text),
      );
      this.notifier.notify(child.id);
      return { kind: "steered", childSessionId: child.id, steerId: receipt.id };
    }
    const { session: parent, account } = await this.repo.getSessionWithAccount(
      args.parentSessionId,
      args.principalAccountId,
    );
    const authority = await this.authorityFor(parent, account);
    const stored = child.scope ?? "";
    // A promotion mints the child's scope again from the caller's live access (keeping its placement, role
    // and context); it replaces the durable scope in the transaction that opens the call.
    const promoted = args.promote ? this.#promotedScope(stored, authority) : undefined;
    // The clamp proves the child's stored scope against the caller's current access before anything is written.
    const clamp = args.callerReadOnly ? readOnlyContinuationScope(stored, authority) : null;
    if (!clamp) continuationScope(promoted ?? stored, authority);
    const { run } = await this.#captured("DelegateContinue", () =>
      this.repo.createContinuation({
        parentSessionId: parent.id,
        principalAccountId: parent.principalAccountId,
        childSessionId: child.id,
        toolCallId: args.toolCallId,
        task: args.text,
        mode: args.mode,
        readOnlyScope: clamp,
        ...(args.model !== undefined ? { model: args.model } : {}),
        ...(promoted !== undefined ? { promotedScope: promoted } : {}),
      }),
    );
    // Admitted: only now does the caller's onEvent hear of the call.
    args.progress?.({ type: "session", sessionId: child.id, parentSessionId: parent.id });
    return this.#dispatch(run, args.mode, args.progress);
  }

  /**
   * A promotion's scope: minted field by field from the caller's live access (no dream marker can come
   * through), on the child's stored placement, role, context and fork flag; tool restrictions and the
   * read-only flag of the old scope are not carried over, the caller's current grant decides them.
   */
  #promotedScope(stored: string, authority: DelegationAuthority & { target: ExecutionTarget }): string {
    const old = parseDelegatedExecutionScope(stored);
    return captureDelegatedExecutionScope(
      delegatedScopeFromAccess({
        accountId: old.accountId,
        operator: authority.operator ?? false,
        target: old.target,
        ...(old.workDir ? { workDir: old.workDir } : {}),
        ...(old.projectRef ? { projectRef: old.projectRef } : {}),
        ...(old.role ? { role: old.role } : {}),
        ...(old.context ? { context: old.context } : {}),
        ...(old.fork ? { fork: true } : {}),
        ...(authority.readOnly ? { readOnly: true, permissionBoundary: "read-only" as const } : {}),
      }),
      authority,
    );
  }

  /**
   * A memory-dreaming run, started by the host only (no tool or plugin input reaches this): a fresh
   * background child of the account's own top-level conversation, forked from its context, whose scope
   * carries the host-minted dream marker under a host-imposed permission boundary (read-only unless the
   * host says otherwise). It runs through the same delegated path as any child; it is never continuable
   * or addressable, and its inherited prefix can be reclaimed once it is terminal and delivered.
   */
  async startDream(args: DreamArgs): Promise<DelegationReceipt> {
    this.#admit("a dream");
    const parent = await this.repo.getSession(args.parentSessionId, args.principalAccountId);
    if (parent.kind !== "root") {
      throw new DelegationError(
        "invalid_input",
        "a dream runs only under an account's own top-level conversation",
        {
          parentSessionId: parent.id,
        },
      );
    }
    const authority = await this.authorityFor(parent);
    const boundary = args.permissionBoundary ?? "read-only";
    const dream = { runId: args.dreamRunId, accountUserId: parent.principalAccountId };
    const scope = captureDelegatedExecutionScope(
      {
        version: 1,
        accountId: parent.principalAccountId,
        operator: false,
        target: authority.target,
        tools: { ...(args.tools?.allow ? { allow: args.tools.allow } : {}), deny: args.tools?.deny ?? [] },
        permissionBoundary: boundary,
        readOnly: boundary === "read-only",
        fork: true,
        dream,
      },
      { ...authority, dream },
    );
    const toolCallId = `dream:${args.dreamRunId}`;
    const { run, child, created } = await this.#captured("a dream", () =>
      this.repo.createDelegation({
        parentSessionId: parent.id,
        principalAccountId: parent.principalAccountId,
        toolCallId,
        task: args.task,
        mode: "background",
        model: args.model ?? parent.model,
        scope,
        fork: { fromSessionId: parent.id },
      }),
    );
    if (created) await this.#captured("a fork copy", () => this.#copyForkContext(parent, child, toolCallId));
    return this.#dispatch(run, "background", args.progress);
  }

  /**
   * Reclaims a terminal dream child's old inherited prefix under the same checks as archiving a child:
   * no turn of it runs here (idle), none of its calls is open, and its results are delivered to the
   * parent. The store module does the bounded work and keeps the marker and costs.
   */
  async reclaimDreamPrefix(
    childSessionId: string,
    principalAccountId: string,
  ): Promise<PrefixReclaim | { readonly reclaimed: false; readonly reason: "busy"; rows: 0; bytes: 0 }> {
    if (this.turns.isBusy(childSessionId)) return { reclaimed: false, reason: "busy", rows: 0, bytes: 0 };
    return this.#captured("a prefix reclamation", () =>
      this.repo.reclaimInheritedPrefix(childSessionId, principalAccountId),
    );
  }

  /**
   * The dream error check, from the dream child's newest turn (getLatestTurn: provisional rows and custom
   * events included): `running` while rows follow its last answer without one of their own (or are still
   * provisional), `failed` when that turn's answer is an error or an abort, else `ok`. Only for dreams.
   */
  async dreamTurnCheck(
    childSessionId: string,
    principalAccountId: string,
  ): Promise<
    | { readonly kind: "ok" }
    | { readonly kind: "running" }
    | { readonly kind: "failed"; readonly reason: string; readonly interrupted: boolean }
  > {
    const child = await this.repo.getSession(childSessionId, principalAccountId);
    const scope = scopeOf(child);
    if (!scope?.dream) {
      throw new DelegationError("invalid_input", "not a memory-dreaming run", { sessionId: childSessionId });
    }
    const turn = await this.repo.latestTurn(child.id, principalAccountId);
    const interrupted = turn.some(
      (e) =>
        e.body.type === "message" &&
        e.body.message.role === "custom" &&
        e.body.message.customType === "interrupted",
    );
    const last = turn.at(-1);
    const answer =
      last?.settled && last.body.type === "message" && last.body.message.role === "assistant"
        ? last.body.message
        : undefined;
    if (!answer || answer.stopReason === "toolUse" || answer.content.some((c) => c.type === "toolCall"))
      return { kind: "running" };
    if (answer.stopReason === "error" || answer.stopReason === "aborted") {
      return {
        kind: "failed",
        reason: answer.errorMessage ?? `the dream's turn ended: ${answer.stopReason}`,
        interrupted,
      };
    }
    return { kind: "ok" };
  }

  readSubagent(
    parentSessionId: string,
    childSessionId: string,
    principalAccountId: string,
  ): Promise<string | undefined> {
    return readSubagent(this.repo, parentSessionId, childSessionId, principalAccountId);
  }

  /**
   * Fork-prefix diagnostics of one of the principal's sessions (see `forkPrefixDiagnostics`): the newest
   * usage-bearing response's cache figures and, for a fork, whether it read the parent's cached prefix.
   */
  forkPrefixDiagnostics(sessionId: string, principalAccountId: string): Promise<ForkPrefixDiagnostics> {
    return forkPrefixDiagnostics(this.repo, sessionId, principalAccountId);
  }

  // ---- settlement

  // ---- settlement (DelegatedSettlement owns it; these keep the service's surface)

  executeRun(run: SubagentRun, opts: Parameters<DelegatedSettlement["executeRun"]>[1] = {}): Promise<string> {
    return this.settlement.executeRun(run, opts);
  }

  runChildTurn(
    child: SessionRow,
    scope: DelegatedExecutionScope,
    progress: ProgressSink,
    signal?: AbortSignal,
  ): ReturnType<DelegatedSettlement["runChildTurn"]> {
    return this.settlement.runChildTurn(child, scope, progress, signal);
  }

  drainPendingResults(
    child: SessionRow,
    scope: DelegatedExecutionScope,
    progress: ProgressSink,
    signal?: AbortSignal,
  ): Promise<PendingResultDrainOutcome> {
    return this.settlement.drainPendingResults(child, scope, progress, signal);
  }

  emitDelegationCompletion(completion: DelegationCompletion): Promise<string> {
    return this.settlement.emitDelegationCompletion(completion);
  }

  /** A workflow summary for `recipient`'s inbox, inline or spilled above the inline limit (see settlement). */
  prepareWorkflowSummary(
    recipient: { sessionId: string; principalAccountId: string },
    workflowId: string,
    summary: string,
    outcome: "ok" | "error",
  ): Promise<PreparedCompletion> {
    return this.settlement.prepareSummary(recipient, workflowId, summary, outcome);
  }
}

/**
 * The permission boundary an account's settings set (`permissionSettings.permissionBoundary`), as
 * plugins/subagent's currentDelegatedAccess reads it; none when unset or not a boundary (nothing narrows).
 */
function accountBoundary(settings: Readonly<Record<string, unknown>>): PermissionBoundary | undefined {
  const b = settings.permissionBoundary;
  return PERMISSION_BOUNDARIES.find((known) => known === b);
}
