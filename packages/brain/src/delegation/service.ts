import { randomUUID } from "node:crypto";
import type { DelegationRepository, SessionRow, SubagentRun, TranscriptMessage } from "@crw/db";
import {
  admitStoredWorkDir,
  captureDelegatedExecutionScope,
  continuationScope,
  type DelegatedExecutionScope,
  type DelegationAuthority,
  delegatedScopeFromAccess,
  delegatedWorkDir,
  type ExecutionTarget,
  type HostProject,
  intersectAllow,
  parseDelegatedExecutionScope,
  readOnlyContinuationScope,
  unionDeny,
  type WorkDirPolicy,
} from "../scope/index.js";
import { endsWithAnswer } from "./context.js";
import { type DelegationEvent, drainResults, type ResultDeliveredEvent } from "./delivery.js";
import { DelegationError, toError } from "./errors.js";
import { faultPoint } from "./faults.js";
import { Notifier } from "./notifier.js";
import { systemPromptFor } from "./prompt.js";
import { lastSettledAssistantText, readSubagent } from "./readSubagent.js";
import type { MutatingTool } from "./scopedTools.js";
import { DEFAULT_TOOL_RESULT_INLINE_BYTES, prepareCompletion, type SpillStore } from "./spill.js";
import { delegationTools } from "./tools.js";
import type { ProgressEvent, ProgressSink, SessionTurnRunner, TurnOutcome, TurnTool } from "./turn.js";
import { SessionTurns } from "./turns.js";

export interface DelegationServiceOptions {
  readonly repo: DelegationRepository;
  readonly runner: SessionTurnRunner;
  readonly spill: SpillStore;
  /** This process's recovery-owner id (defaults to a fresh one). */
  readonly owner?: string;
  readonly toolResultInlineBytes?: () => number;
  /** The session's own tools beside Delegate/DelegateContinue/DelegateRead (a child's file and shell tools). */
  readonly tools?: (session: SessionRow) => readonly MutatingTool[];
  /** Overrides the default composition (worker persona for fresh workers, the parent's prompt for forks). */
  readonly systemPrompt?: (session: SessionRow, scope: DelegatedExecutionScope | null) => string;
  readonly onResultDelivered?: (event: ResultDeliveredEvent) => void | Promise<void>;
  readonly onEvent?: (event: DelegationEvent) => void;
  /**
   * The host's project registry: where a scoped caller's project lives, and which registered project a
   * directory belongs to. Without it, only operators place children (anywhere readable on this host).
   */
  readonly projects?: {
    readonly rootOf?: (ref: string) => Promise<HostProject | undefined> | HostProject | undefined;
    readonly projectForPath?: (dir: string) => Promise<HostProject | undefined> | HostProject | undefined;
  };
  /** Bound of one wait for a child's live helpers; the rows are re-read after each. */
  readonly helperWaitMs?: number;
  /** Bound on follow-up turns in one settlement drain. */
  readonly maxDrainTurns?: number;
}

export interface DelegateArgs {
  readonly parentSessionId: string;
  readonly principalAccountId: string;
  readonly toolCallId: string;
  readonly task: string;
  readonly mode: "foreground" | "background";
  /** The caller's turn is read-only (plan mode): the child is read-only too. */
  readonly callerReadOnly?: boolean;
  readonly role?: string;
  readonly context?: string;
  readonly tools?: { readonly allow?: readonly string[]; readonly deny?: readonly string[] };
  readonly readOnly?: boolean;
  readonly workDir?: string | null;
  readonly model?: string;
  /** A fork: the child continues the parent's transcript and prompt instead of a fresh worker's. */
  readonly fork?: boolean;
  readonly progress?: ProgressSink;
}

export interface ContinueArgs {
  readonly parentSessionId: string;
  readonly principalAccountId: string;
  readonly childSessionId: string;
  readonly toolCallId: string;
  readonly text: string;
  readonly mode: "foreground" | "background";
  readonly callerReadOnly?: boolean;
  /** Asks for write access; refused from a read-only turn. */
  readonly writeAccess?: boolean;
  readonly progress?: ProgressSink;
}

/** What a completion emitter accepts: a sub-agent's result, or one whole-workflow summary. */
export type DelegationCompletion =
  | {
      readonly kind: "subagent";
      readonly runId: string;
      readonly principalAccountId: string;
      readonly outcome: "ok" | "error";
      readonly body: string;
    }
  | {
      readonly kind: "workflow_summary";
      readonly parentSessionId: string;
      readonly principalAccountId: string;
      readonly toolCallId: string;
      readonly outcome: "ok" | "error";
      readonly summary: string;
    };

export type DelegationReceipt =
  | {
      readonly kind: "result";
      readonly runId: string;
      readonly childSessionId: string;
      readonly resultId: string;
      readonly outcome: "ok" | "error";
      readonly body: string;
    }
  | { readonly kind: "started"; readonly runId: string; readonly childSessionId: string }
  | { readonly kind: "steered"; readonly childSessionId: string; readonly steerId: string };

/**
 * The outcome of draining a settling child's pending results and steers into a follow-up turn. `failed`
 * carries the first delivered result id, the reason and the original cause (in memory only; the persisted
 * result payloads stay as they were); `aborted` takes precedence over failure.
 */
export type PendingResultDrainOutcome =
  | { readonly kind: "idle" }
  | { readonly kind: "delivered"; readonly resultIds: readonly string[]; readonly reply: string | undefined }
  | {
      readonly kind: "failed";
      readonly resultId: string | undefined;
      readonly reason: string;
      readonly cause: Error;
    }
  | { readonly kind: "aborted" };

const NO_PROGRESS: ProgressSink = () => {};

/**
 * The delegation core: Delegate, DelegateContinue and DelegateRead, the settlement of a child's call and the
 * exactly-once delivery of its result, over a DelegationRepository and a SessionTurnRunner. It keeps no truth
 * in memory: what ran, what is owed and what was delivered is in the rows; in-memory state only serializes
 * this process's own turns and wakes its own waiters.
 */
export class DelegationService {
  readonly repo: DelegationRepository;
  readonly turns: SessionTurns;
  readonly notifier = new Notifier();
  readonly owner: string;
  readonly #options: DelegationServiceOptions;
  readonly #background = new Set<Promise<unknown>>();
  readonly #drains = new Map<string, Promise<PendingResultDrainOutcome>>();
  #releaseLease: (() => Promise<void>) | undefined;

  constructor(options: DelegationServiceOptions) {
    this.#options = options;
    this.repo = options.repo;
    this.owner = options.owner ?? `crw-${process.pid}-${randomUUID()}`;
    this.turns = new SessionTurns(options.repo, options.runner);
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

  emit(event: DelegationEvent): void {
    this.#options.onEvent?.(event);
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

  /** The current access of a session: the live account grant, narrowed by the session's own durable scope. */
  async authorityFor(session: SessionRow): Promise<DelegationAuthority & { target: ExecutionTarget }> {
    const account = await this.repo.getAccount(session.principalAccountId);
    const own = session.scope ? parseDelegatedExecutionScope(session.scope) : null;
    const allow = intersectAllow(account.toolAllow ?? undefined, own?.tools.allow);
    return {
      accountId: account.id,
      operator: (account.isOwner || account.isAdministrator) && (own ? own.operator : true),
      tools: { ...(allow ? { allow } : {}), deny: unionDeny(account.toolDeny, own?.tools.deny) },
      ...(own ? { permissionBoundary: own.permissionBoundary, readOnly: own.readOnly } : {}),
      target: own?.target ?? { kind: "host", ref: null },
    };
  }

  // ---- root sessions

  createRootSession(principalAccountId: string, model: string): Promise<SessionRow> {
    return this.repo.createRootSession(principalAccountId, model);
  }

  /** One user turn of a root session. Results that arrive while it streams join it after each tool round. */
  async prompt(
    sessionId: string,
    principalAccountId: string,
    text: string,
    options: { readOnly?: boolean; progress?: ProgressSink } = {},
  ): Promise<TurnOutcome> {
    const session = await this.repo.getSession(sessionId, principalAccountId);
    const outcome = await this.turns.exclusive(session.id, () =>
      this.#sessionTurn(session, [{ body: { type: "message", message: { role: "user", content: text } } }], {
        readOnly: options.readOnly ?? false,
        progress: options.progress ?? NO_PROGRESS,
        scope: null,
      }),
    );
    this.#afterIdle(session);
    return outcome;
  }

  async #sessionTurn(
    session: SessionRow,
    input: Parameters<SessionTurns["runLocked"]>[0]["input"],
    opts: { readOnly: boolean; progress: ProgressSink; scope: DelegatedExecutionScope | null },
  ): Promise<TurnOutcome> {
    const own = this.#options.tools?.(session) ?? [];
    const tools = [...delegationTools(this, session, opts.readOnly), ...own];
    const systemPrompt =
      this.#options.systemPrompt?.(session, opts.scope) ?? (await this.#systemPromptOf(session, tools));
    return this.turns.runLocked({
      session,
      input,
      tools,
      scope: opts.scope,
      readOnly: opts.readOnly,
      systemPrompt,
      progress: opts.progress,
      drainSteering: () => this.#drainInto(session),
    });
  }

  /**
   * The session's system prompt, composed once at its first turn and stored with it: later turns,
   * continuations and recovered turns reuse the same bytes. Composition reads the session's permanent scope
   * (never a turn's read-only clamp); a fork takes its parent's prompt byte for byte.
   */
  async #systemPromptOf(session: SessionRow, tools: readonly TurnTool[]): Promise<string> {
    const fresh = await this.repo.getSession(session.id, session.principalAccountId);
    if (fresh.systemPrompt !== null) return fresh.systemPrompt;
    const parentOf = (s: SessionRow) => this.repo.getSession(s.parentSessionId ?? "", s.principalAccountId);
    const own = session.scope ? parseDelegatedExecutionScope(session.scope) : null;
    let composed: string;
    if (own?.fork && session.parentSessionId) {
      const parent = await parentOf(session);
      composed = parent.systemPrompt ?? (await systemPromptFor(parent, null, tools, parentOf));
    } else {
      composed = await systemPromptFor(session, null, tools, parentOf);
    }
    return this.repo.setSystemPrompt(session.id, session.principalAccountId, composed);
  }

  /** Journals (and acknowledges) what arrived for a session: its queued results, then a child's text steers. */
  async #drainInto(session: SessionRow): Promise<TranscriptMessage[]> {
    const results = await drainResults(this.#deliveryDeps(), session.id, session.principalAccountId);
    if (session.kind !== "delegated") return results;
    const steers = await this.repo.pendingSteers(session.id, session.principalAccountId);
    const delivered = await this.repo.deliverSteers(
      session.id,
      session.principalAccountId,
      steers.map((s) => s.id),
    );
    return [...results, ...delivered.map((s): TranscriptMessage => ({ role: "user", content: s.text }))];
  }

  #deliveryDeps() {
    return {
      repo: this.repo,
      notifier: this.notifier,
      emit: (e: DelegationEvent) => this.emit(e),
      ...(this.#options.onResultDelivered ? { onResultDelivered: this.#options.onResultDelivered } : {}),
    };
  }

  /**
   * A result entered `parentSessionId`'s inbox. A streaming parent takes it at its next tool round; a
   * settling child's drain is woken; an idle root parent gets one batched follow-up turn.
   */
  async resultQueued(parentSessionId: string, principalAccountId: string, resultId: string): Promise<void> {
    this.emit({ type: "delegation.result_steered", parentSessionId, resultId });
    this.notifier.notify(parentSessionId);
    const parent = await this.repo.getSession(parentSessionId, principalAccountId);
    if (parent.kind === "root") this.#afterIdle(parent);
  }

  /** A root session's turn ended outside `prompt` (a host-driven turn): deliver what waits for it. */
  parentIdle(session: SessionRow): void {
    this.#afterIdle(session);
  }

  /** After a root session's turn, or a result for it: if results wait and no turn holds it, follow up once. */
  #afterIdle(session: SessionRow): void {
    if (this.turns.isBusy(session.id)) return;
    this.track(this.followUp(session));
  }

  /**
   * The idle parent's batched follow-up: every queued result is journaled and acknowledged first, then one
   * turn answers them all. A failed answer leaves them delivered: nothing durable is requeued.
   */
  async followUp(session: SessionRow): Promise<TurnOutcome | undefined> {
    const outcome = await this.turns.exclusive(session.id, async () => {
      const delivered = await drainResults(this.#deliveryDeps(), session.id, session.principalAccountId);
      if (delivered.length === 0) return undefined;
      return this.#sessionTurn(session, [], { readOnly: false, progress: NO_PROGRESS, scope: null });
    });
    if (outcome !== undefined) {
      const more = await this.repo.queuedResultIds(session.id, session.principalAccountId);
      if (more.length > 0) this.#afterIdle(session);
    }
    return outcome;
  }

  // ---- Delegate / DelegateContinue / DelegateRead

  async delegate(args: DelegateArgs): Promise<DelegationReceipt> {
    const parent = await this.repo.getSession(args.parentSessionId, args.principalAccountId);
    const authority = await this.authorityFor(parent);
    const readOnly = args.readOnly === true || args.callerReadOnly === true || authority.readOnly === true;
    // Delegate's cwd goes through delegatedWorkDir under the child's own live policy; the placement's
    // target is persisted together with the directory.
    const placement = args.workDir
      ? await delegatedWorkDir(args.workDir, await this.#workDirPolicy(authority))
      : null;
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
    const { run, child, created } = await this.repo.createDelegation({
      parentSessionId: parent.id,
      principalAccountId: parent.principalAccountId,
      toolCallId: args.toolCallId,
      task: args.task,
      mode: args.mode,
      model: args.fork ? parent.model : (args.model ?? parent.model),
      scope,
      ...(args.fork ? { fork: { fromSessionId: parent.id } } : {}),
    });
    if (args.fork && created) await this.#copyForkContext(parent, child, args.toolCallId);
    args.progress?.({ type: "session", sessionId: child.id, parentSessionId: parent.id });
    return this.#dispatch(run, args.mode, args.progress);
  }

  async #workDirPolicy(authority: { operator?: boolean; target: ExecutionTarget }): Promise<WorkDirPolicy> {
    const target = authority.target;
    const projectForPath = this.#options.projects?.projectForPath;
    const admin: WorkDirPolicy = {
      kind: "admin",
      canExecuteHost: authority.operator === true,
      ...(projectForPath ? { projectForPath } : {}),
    };
    switch (target.kind) {
      case "local":
        return { kind: "local", targetId: target.targetId };
      case "managed":
        return { kind: "managed", ref: target.ref, guestRoot: target.root };
      case "host": {
        if (target.ref === null) return admin;
        const project = await this.#options.projects?.rootOf?.(target.ref);
        if (project) return { kind: "scoped", project };
        if (authority.operator) return admin;
        throw new DelegationError("invalid_input", `project ${target.ref} is not registered on this host`, {
          projectRef: target.ref,
        });
      }
    }
  }

  /**
   * A fork's context: the parent's settled journal up to (not including) the assistant message that asked
   * for this fork, copied in batches outside any writer transaction of the parent; the copy becomes visible
   * only when complete. A crash before that leaves a private copy that boot discards.
   */
  async #copyForkContext(parent: SessionRow, child: SessionRow, toolCallId: string): Promise<void> {
    const journal = await this.repo.readJournal(parent.id, parent.principalAccountId);
    const asking = journal.find(
      (e) =>
        e.body.type === "message" &&
        e.body.message.role === "assistant" &&
        e.body.message.content.some((c) => c.type === "toolCall" && c.id === toolCallId),
    );
    const upto = asking ? asking.seq - 1 : (journal.at(-1)?.seq ?? 0);
    if (upto > 0) await this.repo.copyJournalBranch(parent.id, child.id, parent.principalAccountId, upto);
    await this.repo.commitFork(child.id, parent.principalAccountId);
  }

  async #dispatch(
    run: SubagentRun,
    mode: "foreground" | "background",
    progress?: ProgressSink,
  ): Promise<DelegationReceipt> {
    const childSessionId = run.childSessionId ?? "";
    if (mode === "background") {
      this.track(this.executeRun(run, { ...(progress ? { progress } : {}) }));
      return { kind: "started", runId: run.id, childSessionId };
    }
    const resultId = await this.executeRun(run, { ...(progress ? { progress } : {}) });
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
   * DelegateContinue. With the child busy: a planning (read-only) caller must wait; a Build caller must wait
   * for a read-only call, and otherwise steers its text into the open call. With the child free: a
   * read-only caller's continuation is bound to the new row as `read_only_scope` before dispatch.
   */
  async continueSubagent(args: ContinueArgs): Promise<DelegationReceipt> {
    if (args.callerReadOnly && args.writeAccess) {
      throw new DelegationError(
        "write_access_refused",
        "write access cannot be granted from a read-only turn",
        {
          childSessionId: args.childSessionId,
        },
      );
    }
    const child = await this.repo.getChildSession(
      args.parentSessionId,
      args.childSessionId,
      args.principalAccountId,
    );
    const open = await this.repo.openRunForChild(child.id, args.principalAccountId);
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
      const receipt = await this.repo.enqueueSteer(child.id, args.principalAccountId, args.text);
      this.notifier.notify(child.id);
      return { kind: "steered", childSessionId: child.id, steerId: receipt.id };
    }
    const parent = await this.repo.getSession(args.parentSessionId, args.principalAccountId);
    const authority = await this.authorityFor(parent);
    const stored = child.scope ?? "";
    // The clamp proves the child's stored scope against the caller's current access before anything is written.
    const clamp = args.callerReadOnly ? readOnlyContinuationScope(stored, authority) : null;
    if (!clamp) continuationScope(stored, authority);
    const { run } = await this.repo.createContinuation({
      parentSessionId: parent.id,
      principalAccountId: parent.principalAccountId,
      childSessionId: child.id,
      toolCallId: args.toolCallId,
      task: args.text,
      mode: args.mode,
      readOnlyScope: clamp,
    });
    return this.#dispatch(run, args.mode, args.progress);
  }

  readSubagent(
    parentSessionId: string,
    childSessionId: string,
    principalAccountId: string,
  ): Promise<string | undefined> {
    return readSubagent(this.repo, parentSessionId, childSessionId, principalAccountId);
  }

  // ---- settlement

  /**
   * Runs a call to its settlement: its turn, then (while the call is settling) every pending helper result
   * and text steer in follow-up turns, waiting out live helpers; only then is the result written to the
   * parent's inbox (with the run terminal, one transaction) and the parent told. Returns the result id.
   */
  async executeRun(
    run: SubagentRun,
    opts: { progress?: ProgressSink; signal?: AbortSignal } = {},
  ): Promise<string> {
    if (!run.childSessionId)
      return this.#settle(
        run,
        "error",
        "the child session was discarded before it was ready",
        "child_missing",
      );
    const start = await this.repo.startRun(run.id, run.generation, this.owner);
    if (!start.started) {
      // The same call again (a retried tool call): its settled result is the answer, never a second run.
      const settled = await this.repo.resultForRun(run.id, run.principalAccountId);
      if (settled) return settled.id;
      throw new DelegationError("child_failed", "the call is no longer open in this generation", {
        runId: run.id,
      });
    }
    const child = await this.repo.getSession(run.childSessionId, run.principalAccountId);
    // Every turn of the call reads the call's own scope (its read-only clamp, else the child's durable
    // scope), narrowed by the delegating side's live access: current grants only ever narrow it.
    let scope: DelegatedExecutionScope;
    try {
      const parent = await this.repo.getSession(run.parentSessionId, run.principalAccountId);
      scope = parseDelegatedExecutionScope(
        continuationScope(run.readOnlyScope ?? child.scope ?? "", await this.authorityFor(parent)),
      );
      // Channel admission of the stored placement: a vanished directory, or one that no longer belongs to
      // its host target, refuses the turn; the admitted (real) path is where the turn runs.
      const admitted = await admitStoredWorkDir(scope, this.#options.projects?.projectForPath);
      scope = { ...scope, workDir: admitted };
    } catch (e) {
      return this.#settle(
        run,
        "error",
        `the call's scope no longer holds: ${toError(e).message}`,
        "scope_refused",
      );
    }
    const progress = opts.progress ?? NO_PROGRESS;
    let outcome: TurnOutcome = { stopReason: "stop" };
    const journal = await this.repo.readJournal(child.id, run.principalAccountId);
    if (!endsWithAnswer(journal))
      outcome = (await this.runChildTurn(child, scope, progress, opts.signal)).outcome;
    const drained = await this.#settlementDrain(run, child, scope, progress, outcome, opts.signal);
    await this.repo.markRunSettling(run.id, run.generation);
    if (drained.kind === "failed" || drained.kind === "aborted") {
      const reason = drained.kind === "failed" ? drained.reason : "the call was stopped";
      // Text follow-ups the call can no longer take get their dropped notice instead of waiting forever.
      await this.repo.dropSteers(child.id, run.principalAccountId, `the call ended: ${reason}`);
      return this.#settle(run, "error", reason, drained.kind === "failed" ? "child_failed" : "aborted");
    }
    const reply = await lastSettledAssistantText(this.repo, child.id, run.principalAccountId);
    const resultId = await this.#settle(run, "ok", reply ?? "(the child gave no answer)");
    // A follow-up that raced the settlement would otherwise wait for a call that is gone: it gets its notice.
    await this.repo.dropSteers(
      child.id,
      run.principalAccountId,
      "the call settled before this follow-up was taken",
    );
    return resultId;
  }

  /**
   * DelegatedSettlement.runChildTurn: the one bracket for a call's turns, text follow-ups and result turns.
   * It waits for the child's current turn (callers queue, FIFO), journals what is pending, runs one turn
   * and returns the newest settled reply. It adds no queue or timer of its own beyond the session lock.
   */
  runChildTurn(
    child: SessionRow,
    scope: DelegatedExecutionScope,
    progress: ProgressSink,
    signal?: AbortSignal,
  ): Promise<{ outcome: TurnOutcome; reply: string | undefined; delivered: string[] }> {
    return this.turns.exclusive(child.id, async () => {
      const pending = await this.#drainInto(child);
      const delivered = pending.flatMap((m) =>
        m.role === "custom" && m.details?.resultId ? [m.details.resultId] : [],
      );
      const outcome =
        signal?.aborted === true
          ? ({ stopReason: "aborted" } as const)
          : await this.#sessionTurn(child, [], {
              readOnly: scope.readOnly,
              progress: inheritSink(progress),
              scope,
            });
      const reply = await lastSettledAssistantText(this.repo, child.id, child.principalAccountId);
      return { outcome, reply, delivered };
    });
  }

  async #settlementDrain(
    run: SubagentRun,
    child: SessionRow,
    scope: DelegatedExecutionScope,
    progress: ProgressSink,
    first: TurnOutcome,
    signal?: AbortSignal,
  ): Promise<PendingResultDrainOutcome> {
    if (signal?.aborted || first.stopReason === "aborted") return { kind: "aborted" };
    if (first.stopReason === "error") {
      return {
        kind: "failed",
        resultId: undefined,
        reason: first.errorMessage ?? "the child's turn failed",
        cause: new Error(first.errorMessage),
      };
    }
    const bound = this.#options.maxDrainTurns ?? 32;
    let last: PendingResultDrainOutcome = { kind: "idle" };
    for (let turns = 0; turns < bound; ) {
      if (signal?.aborted) return { kind: "aborted" };
      // Live helpers first: a helper's result and its terminal status commit together, so once none is
      // open, every helper result is already in the inbox and the reads below cannot miss one.
      const live = await this.repo.openChildRuns(child.id, run.principalAccountId);
      if (live.length > 0) {
        // Their settlement wakes this waiter; the bound re-reads rows a wake-up could miss.
        await this.notifier.wait(child.id, this.#options.helperWaitMs ?? 1000);
        continue;
      }
      const steers = await this.repo.pendingSteers(child.id, run.principalAccountId);
      const queued = await this.repo.queuedResultIds(child.id, run.principalAccountId);
      if (steers.length === 0 && queued.length === 0) return last;
      faultPoint("drain.during");
      last = await this.drainPendingResults(child, scope, progress, signal);
      if (last.kind === "failed" || last.kind === "aborted") return last;
      turns++;
    }
    return {
      kind: "failed",
      resultId: undefined,
      reason: `more than ${bound} follow-up turns while settling`,
      cause: new Error("drain bound"),
    };
  }

  /** One drain of a settling child; concurrent callers join the same drain and get the same outcome. */
  drainPendingResults(
    child: SessionRow,
    scope: DelegatedExecutionScope,
    progress: ProgressSink,
    signal?: AbortSignal,
  ): Promise<PendingResultDrainOutcome> {
    const joined = this.#drains.get(child.id);
    if (joined) return joined;
    const drain = (async (): Promise<PendingResultDrainOutcome> => {
      try {
        const { outcome, reply, delivered } = await this.runChildTurn(child, scope, progress, signal);
        if (signal?.aborted || outcome.stopReason === "aborted") return { kind: "aborted" };
        if (outcome.stopReason === "error") {
          const reason = outcome.errorMessage ?? "the follow-up turn failed";
          return { kind: "failed", resultId: delivered[0], reason, cause: new Error(reason) };
        }
        return { kind: "delivered", resultIds: delivered, reply };
      } catch (e) {
        const cause = toError(e);
        if (signal?.aborted) return { kind: "aborted" };
        return { kind: "failed", resultId: undefined, reason: cause.message, cause };
      }
    })();
    this.#drains.set(child.id, drain);
    void drain.finally(() => this.#drains.delete(child.id));
    return drain;
  }

  #inlineBytes(): number {
    return this.#options.toolResultInlineBytes?.() ?? DEFAULT_TOOL_RESULT_INLINE_BYTES;
  }

  /**
   * The one completion sink (emitDelegationCompletion): a sub-agent's result settles its run; a workflow
   * delivers one whole-workflow summary for its tool call, never its individual node results. Both are
   * prepared the same way (inline or spilled) before the inbox handoff; delivery then follows the parent's
   * state like any result. Returns the result id.
   */
  async emitDelegationCompletion(completion: DelegationCompletion): Promise<string> {
    if (completion.kind === "subagent") {
      const run = await this.repo.getRun(completion.runId, completion.principalAccountId);
      return this.#settle(run, completion.outcome, completion.body);
    }
    const resultId = randomUUID();
    const prepared = await prepareCompletion({
      repo: this.repo,
      spill: this.#options.spill,
      inlineBytes: this.#inlineBytes(),
      recipient: {
        sessionId: completion.parentSessionId,
        principalAccountId: completion.principalAccountId,
        fileName: `${resultId}.txt`,
      },
      readHint: "The workflow's node outputs remain readable with DelegateRead on each node's child.",
      outcome: completion.outcome,
      body: completion.summary,
    });
    const queued = await this.repo.enqueueWorkflowSummary({
      resultId,
      parentSessionId: completion.parentSessionId,
      principalAccountId: completion.principalAccountId,
      toolCallId: completion.toolCallId,
      outcome: prepared.outcome,
      body: prepared.body,
      byteSize: prepared.byteSize,
      ...(prepared.spillId ? { spillId: prepared.spillId } : {}),
    });
    if (queued.created)
      await this.resultQueued(completion.parentSessionId, completion.principalAccountId, queued.resultId);
    return queued.resultId;
  }

  async #settle(run: SubagentRun, outcome: "ok" | "error", body: string, code?: string): Promise<string> {
    const prepared = await prepareCompletion({
      repo: this.repo,
      spill: this.#options.spill,
      inlineBytes: this.#inlineBytes(),
      recipient: {
        sessionId: run.parentSessionId,
        principalAccountId: run.principalAccountId,
        fileName: `${run.id}.txt`,
      },
      readHint: `Read it with DelegateRead on child ${run.childSessionId}.`,
      outcome,
      body,
    });
    const error =
      prepared.error ?? (outcome === "error" ? { code: code ?? "child_failed", message: body } : undefined);
    const settled = await this.repo.settleRun({
      runId: run.id,
      generation: run.generation,
      resultId: randomUUID(),
      outcome: prepared.outcome,
      body: prepared.body,
      byteSize: prepared.byteSize,
      ...(prepared.spillId ? { spillId: prepared.spillId } : {}),
      ...(error ? { error } : {}),
    });
    faultPoint("child.settled");
    if (run.mode === "background" || !this.turns.isStreaming(run.parentSessionId)) {
      await this.resultQueued(run.parentSessionId, run.principalAccountId, settled.resultId);
    } else {
      this.notifier.notify(run.parentSessionId);
    }
    return settled.resultId;
  }
}

/** The open call's sink for result turns: activity renews the stall watchdog; identity events stay out. */
function inheritSink(sink: ProgressSink): ProgressSink {
  return (event: ProgressEvent) => {
    if (event.type !== "session") sink(event);
  };
}
