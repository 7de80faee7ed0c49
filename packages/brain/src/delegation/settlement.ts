import { createHash, randomUUID } from "node:crypto";
import { resolve } from "node:path";
import {
  type Account,
  type DelegationRepository,
  type JournalDelta,
  type JournalEntry,
  type JournalWrite,
  OPEN_RUN_STATUSES,
  type SessionRow,
  type SettlementWork,
  type SubagentRun,
  type TranscriptMessage,
} from "@crw/db";
import {
  admitStoredWorkDir,
  continuationScope,
  type DelegatedExecutionScope,
  type DelegationAuthority,
  parseDelegatedExecutionScope,
} from "../scope/index.js";
import { posixInside } from "../scope/paths.js";
import type { CapturedWrites } from "./checkpoint.js";
import { endsWithAnswer } from "./context.js";
import { DelegationError, hostContract, toError } from "./errors.js";
import { faultPoint } from "./faults.js";
import { commitIsolatedWork } from "./isolation.js";
import type { Notifier } from "./notifier.js";
import type { RunProgressSnapshot } from "./progress.js";
import { latestAssistantText, replyOf } from "./readSubagent.js";
import {
  DEFAULT_TOOL_RESULT_INLINE_BYTES,
  type PreparedCompletion,
  prepareCompletion,
  type SpillStore,
} from "./spill.js";
import {
  NO_PROGRESS,
  type ProgressEvent,
  type ProgressSink,
  type TurnOutcome,
  turnFailureCause,
} from "./turn.js";
import type { SessionTurns } from "./turns.js";
import type { DelegationCompletion, DelegationServiceOptions, PendingResultDrainOutcome } from "./types.js";

/** The settling mark with the child's reply, as the drain's last look made it (its inbox idle). */
interface SettlingSeen {
  idle?: Awaited<ReturnType<SettlementCore["repo"]["markSettlingWithReply"]>>;
}

/** Publishes a call's result (inline or spilled) and wakes its parent; returns the result id. */
/** `dropSteers`: the reason the child's pending steers are dropped with, in the settlement's statement. */
type Settle = (
  run: SubagentRun,
  outcome: "ok" | "error",
  body: string,
  code?: string,
  dropSteers?: string,
  progress?: RunProgressSnapshot,
) => Promise<string>;

/**
 * What a drain saw of a session's inbox, for the turn it starts: `spillsReachable` is set when it read
 * whether a spilled result or an open child run is there (see DelegationService.drainInto).
 */
export interface InboxLook {
  spillsReachable?: boolean;
}

/** What settlement needs from the service that owns it (DelegationService implements it). */
export interface SettlementCore {
  readonly repo: DelegationRepository;
  readonly owner: string;
  readonly turns: SessionTurns;
  readonly notifier: Notifier;
  readonly options: DelegationServiceOptions;
  /** Journal writes and publications, drained (and then refused) by the restart checkpoint. */
  readonly writes: CapturedWrites;
  authorityFor(session: SessionRow, live?: Account): Promise<DelegationAuthority>;
  sessionTurn(
    session: SessionRow,
    input: readonly JournalWrite[],
    opts: {
      readOnly: boolean;
      progress: ProgressSink;
      scope: DelegatedExecutionScope | null;
      inbox?: InboxLook;
      /** Aborts the turn wherever it is: queued for a runner, in a runner, or in this process. */
      signal?: AbortSignal;
    },
  ): Promise<TurnOutcome>;
  /** `known`: the session's settlementWork already read (not read again). */
  drainInto(session: SessionRow, look?: InboxLook, known?: SettlementWork): Promise<TranscriptMessage[]>;
  resultQueued(parentSessionId: string, principalAccountId: string, resultId: string): Promise<void>;
  /** Runs work outside any caller (its failure is reported, its rows stay for recovery). */
  track(work: Promise<unknown>): void;
}

/**
 * DelegatedSettlement: completing a call's child-owned work before its result is published. A call runs its
 * turn; while it settles, pending helper results and text steers run in follow-up turns through the one
 * bracket (`runChildTurn`) and live helpers are waited out; then the result (inline or spilled) enters the
 * parent's inbox with the run terminal, in one transaction, and the parent is told.
 */
/** How a parent still reads a workflow's node outputs when its summary could not be stored. */
const SUMMARY_READ_HINT =
  "The workflow's node outputs remain readable with DelegateRead on each node's child.";

export class DelegatedSettlement {
  readonly #drains = new Map<string, Promise<PendingResultDrainOutcome>>();
  /** The calls this process is running, by child session: their scope and progress, for result turns. */
  readonly #calls = new Map<
    string,
    { scope: DelegatedExecutionScope; progress: ProgressSink; child: SessionRow }
  >();

  constructor(private readonly core: SettlementCore) {}

  /**
   * Runs a call to its settlement: its turn, then (while the call is settling) every pending helper result
   * and text steer in follow-up turns, waiting out live helpers; only then is the result written to the
   * parent's inbox (with the run terminal, one transaction) and the parent told. Returns the result id.
   */
  async executeRun(
    run: SubagentRun,
    opts: {
      progress?: ProgressSink;
      signal?: AbortSignal;
      /** The call's progress drained; a snapshot it answers is written with the result. */
      beforeSettle?: () => Promise<RunProgressSnapshot | undefined>;
      /** That snapshot, when its settlement did not commit (the call stays open): published after all. */
      unsettledProgress?: (snapshot: RunProgressSnapshot) => Promise<void>;
      /** The parent and its authority, when the caller read them just now for this call (Delegate). */
      known?: { parent: SessionRow; authority: DelegationAuthority };
      /**
       * For a run that had started (boot recovery): the row its turn answers (the interrupted context, or
       * the task again for an empty journal), appended by the call's start in the same statement; the
       * journal then cannot end with an answer, so it is not read for that.
       */
      resumeWith?: JournalWrite;
      /**
       * The child's whole journal as the caller read it before the start (boot recovery, a short journal),
       * with the seq its next row takes: with the row the start appends at that seq, the first turn's context.
       */
      journalBefore?: { journal: JournalDelta; nextSeq: number };
    } = {},
  ): Promise<string> {
    // The owning job's progress publication drains before the result is settled: no progress after it.
    const settle: Settle = async (run, outcome, body, code, dropSteers) => {
      const progress = await opts.beforeSettle?.();
      try {
        return await this.#settle(run, outcome, body, code, dropSteers, progress);
      } catch (e) {
        if (progress) await opts.unsettledProgress?.(progress);
        throw e;
      }
    };
    if (!run.childSessionId)
      return settle(run, "error", "the child session was discarded before it was ready", "child_missing");
    // A turn of the child that runs or waits now may append rows after the start's read and end before the
    // call's first turn looks: the start's inbox look and journal then do not stand for the turn's own.
    const busyAtStart = this.core.turns.isBusy(run.childSessionId);
    const start = await this.core.writes.capture("a call's start", () =>
      this.core.repo.startRun(
        run.id,
        run.generation,
        this.core.owner,
        run.childSessionId ?? undefined,
        opts.resumeWith,
      ),
    );
    if (!start.started) {
      // The same call again (a retried tool call): its settled result is the answer, never a second run.
      const settled = await this.core.repo.resultForRun(run.id, run.principalAccountId);
      if (settled) return settled.id;
      throw new DelegationError("child_failed", "the call is no longer open in this generation", {
        runId: run.id,
      });
    }
    // The start read the child's row (as getSession would) in its own statement: not read again.
    const stored =
      start.child ?? (await this.core.repo.getSession(run.childSessionId, run.principalAccountId));
    // A continuation's own model is this call's: every turn of it (and its recovery) runs on it.
    const child = run.model ? { ...stored, model: run.model } : stored;
    // Every turn of the call reads the call's own scope (its read-only clamp, else the child's durable
    // scope), narrowed by the delegating side's live access: current grants only ever narrow it.
    let scope: DelegatedExecutionScope;
    try {
      // Delegate read the parent and its live authority just before admitting this call: the same read.
      const authority =
        opts.known?.parent.id === run.parentSessionId ? opts.known.authority : await this.#liveAuthority(run);
      scope = parseDelegatedExecutionScope(
        continuationScope(run.readOnlyScope ?? child.scope ?? "", authority),
      );
      // Channel admission of the stored placement: a vanished directory, or one that no longer belongs to
      // its host target, refuses the turn; the admitted (real) path is where the turn runs.
      const admitted = await admitStoredWorkDir(scope, this.core.options.projects?.projectForPath);
      scope = { ...scope, workDir: admitted };
    } catch (e) {
      return settle(run, "error", `the call's scope no longer holds: ${toError(e).message}`, "scope_refused");
    }
    const progress = opts.progress ?? NO_PROGRESS;
    this.#calls.set(child.id, { scope, progress, child });
    try {
      return await this.#runCall(
        run,
        child,
        scope,
        progress,
        opts.signal,
        settle,
        start.appended,
        busyAtStart ? undefined : start.work,
        start.journal ?? withStartRow(opts.journalBefore, start.row),
      );
    } finally {
      this.#calls.delete(child.id);
    }
  }

  /** The delegating session's live authority: it and its account read in one snapshot. */
  async #liveAuthority(run: SubagentRun): Promise<DelegationAuthority> {
    const { session, account } = await this.core.repo.getSessionWithAccount(
      run.parentSessionId,
      run.principalAccountId,
    );
    return this.core.authorityFor(session, account);
  }

  async #runCall(
    run: SubagentRun,
    child: SessionRow,
    scope: DelegatedExecutionScope,
    progress: ProgressSink,
    signal: AbortSignal | undefined,
    settle: Settle,
    unanswered: boolean,
    work?: SettlementWork,
    journal?: JournalDelta,
  ): Promise<string> {
    let outcome: TurnOutcome = { stopReason: "stop" };
    // The start just journaled the newest row (the task, or a recovered run's interrupted context): under
    // this run's lease nothing else answers it, so the journal cannot end with an answer and is not read.
    const answered =
      !unanswered && endsWithAnswer(await this.core.repo.readJournalTail(child.id, run.principalAccountId));
    if (!answered)
      outcome = (await this.#childTurn(child, scope, progress, signal, { first: { work, journal } })).outcome;
    const seen: SettlingSeen = {};
    const drained = await this.#settlementDrain(run, child, scope, progress, outcome, signal, seen);
    // Pausing for a restart: the call stays open and boot recovery continues it; nothing is settled here.
    if (drained.kind === "failed" || drained.kind === "aborted") {
      await this.core.writes.capture("a call's settlement", () =>
        this.core.repo.markRunSettling(run.id, run.generation),
      );
      const reason = drained.kind === "failed" ? drained.reason : "the call was stopped";
      // Text follow-ups the call can no longer take get their dropped notice instead of waiting forever.
      await this.core.writes.capture("a call's settlement", () =>
        this.core.repo.dropSteers(child.id, run.principalAccountId, `the call ended: ${reason}`),
      );
      const kept = await this.#isolatedWork(child, run, scope);
      return settle(run, "error", `${reason}${kept}`, drained.kind === "failed" ? "child_failed" : "aborted");
    }
    // The mark and the reply the turn just wrote, in one statement: the drain's last look when it made them.
    const settling =
      seen.idle ??
      (await this.core.writes.capture("a call's settlement", () =>
        this.core.repo.markSettlingWithReply(run.id, run.generation, child.id, run.principalAccountId),
      ));
    const reply = replyOf(settling.reply?.message);
    const kept = await this.#isolatedWork(child, run, scope);
    // A follow-up that raced the settlement would otherwise wait for a call that is gone: it gets its notice,
    // in the settlement's own statement.
    return settle(
      run,
      "ok",
      `${reply ?? "(the child gave no answer)"}${kept}`,
      undefined,
      "the call settled before this follow-up was taken",
    );
  }

  /** An isolated child's work, committed before its result: the result names the branch and commit. */
  async #isolatedWork(child: SessionRow, run: SubagentRun, scope: DelegatedExecutionScope): Promise<string> {
    // Only a child placed under the host's worktrees can have one: every other settlement asks nothing.
    const worktrees = this.core.options.worktreesDir;
    if (!worktrees || !scope.workDir || !posixInside(resolve(worktrees), scope.workDir)) return "";
    try {
      return await commitIsolatedWork(this.core.repo, child, run.task);
    } catch (e) {
      // The result still settles: what the child left stays in its worktree, and the result says why.
      return `\n\n[crw] the work in the child's worktree could not be committed: ${toError(e).message}`;
    }
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
    return this.#childTurn(child, scope, progress, signal, {});
  }

  /**
   * `runChildTurn`. `first`, for a call's first turn: its reply is not read (its settlement reads it);
   * `work` is the inbox as the call's start read it (none when a turn of the child ran or waited at the
   * start), standing for the drain's own look while nothing can have run a turn of the child since (no turn
   * of it waits here, and it has no open child run: a helper's result turn is the only other way one starts); `journal` is the child's whole journal as the start left
   * it, the turn's context while that look holds and the drain journals nothing.
   */
  #childTurn(
    child: SessionRow,
    scope: DelegatedExecutionScope,
    progress: ProgressSink,
    signal: AbortSignal | undefined,
    { first }: { first?: { work: SettlementWork | undefined; journal: JournalDelta | undefined } },
  ): Promise<{ outcome: TurnOutcome; reply: string | undefined; delivered: string[] }> {
    const started = first?.work;
    const known =
      started && started.openChildRuns === 0 && !this.core.turns.isBusy(child.id) ? started : undefined;
    const journal = first?.journal;
    return this.core.turns.exclusive(child.id, async () => {
      const inbox: InboxLook = {};
      const pending = await this.core.writes.capture(
        "a delivery",
        () => this.core.drainInto(child, inbox, known),
        child.id,
      );
      const delivered = pending.flatMap((m) =>
        m.role === "custom" && m.details?.resultId ? [m.details.resultId] : [],
      );
      const outcome =
        signal?.aborted === true
          ? ({ stopReason: "aborted" } as const)
          : await this.core.sessionTurn(child, [], {
              readOnly: scope.readOnly,
              progress: inheritSink(progress),
              scope,
              inbox,
              ...(signal ? { signal } : {}),
              ...(known && journal && pending.length === 0 ? { journal } : {}),
            });
      const reply = !first
        ? await latestAssistantText(this.core.repo, child.id, child.principalAccountId)
        : undefined;
      return { outcome, reply, delivered };
    });
  }

  async #settlementDrain(
    run: SubagentRun,
    child: SessionRow,
    scope: DelegatedExecutionScope,
    progress: ProgressSink,
    first: TurnOutcome,
    signal: AbortSignal | undefined,
    seen: SettlingSeen,
  ): Promise<PendingResultDrainOutcome> {
    if (signal?.aborted || first.stopReason === "aborted") return { kind: "aborted" };
    if (first.stopReason === "error") {
      return {
        kind: "failed",
        resultId: undefined,
        reason: first.errorMessage ?? "the child's turn failed",
        cause: turnFailureCause(first, "the child's turn failed"),
      };
    }
    const bound = this.core.options.maxDrainTurns ?? 32;
    let last: PendingResultDrainOutcome = { kind: "idle" };
    let turns = 0;
    for (;;) {
      if (signal?.aborted) return { kind: "aborted" };
      // Live helpers first: a helper's result and its terminal status commit together, so once none is
      // open, every helper result is already in the inbox and the reads below cannot miss one.
      // One snapshot of all three when the repository has it: no helper is open in it, so every helper
      // result is in it too. The same statement marks the run settling, with the reply, once all three are
      // none (the settlement then needs no statement of its own for them).
      const look = this.core.repo.settlementWork
        ? await this.core.writes.capture("a call's settlement", () =>
            this.core.repo.markSettlingWithReply(run.id, run.generation, child.id, run.principalAccountId, {
              whenIdle: true,
            }),
          )
        : undefined;
      const work = look?.work;
      const live =
        work?.openChildRuns ?? (await this.core.repo.openChildRuns(child.id, run.principalAccountId)).length;
      if (live > 0) {
        // Their settlement wakes this waiter; the bound re-reads rows a wake-up could miss.
        await this.core.notifier.wait(child.id, this.core.options.helperWaitMs ?? 1000);
        continue;
      }
      // A result turn started on its own (a workflow completion) holds the call until it finishes.
      const joined = this.#drains.get(child.id);
      if (joined) {
        last = await joined;
        if (last.kind === "failed" || last.kind === "aborted") return last;
        continue;
      }
      // With `work`, its counts stand: a result turn joined above (which could change them) loops first.
      const steers =
        work?.pendingSteers ?? (await this.core.repo.pendingSteers(child.id, run.principalAccountId)).length;
      const queued =
        work?.queuedResults ??
        (await this.core.repo.queuedResultIds(child.id, run.principalAccountId)).length;
      if (steers === 0 && queued === 0) {
        // nothing open, nothing waiting: the look's mark (and its reply) stand for the settlement
        seen.idle = look;
        return last;
      }
      // The bound is on turns taken: the last one it allows may take the last pending work and settle.
      if (turns >= bound) break;
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

  /**
   * A workflow completion for a delegated session whose call this process runs and whose turn has ended
   * (its settlement is waiting, e.g. on live helpers) starts the result turn itself, through the same
   * bracket and drain, independently of the settlement drain; a running turn takes it at its next tool
   * round instead. The open call is held until that turn finishes (committing the summary releases
   * nothing), and its result is the newest settled reply.
   */
  resultTurnFor(sessionId: string): void {
    const call = this.#calls.get(sessionId);
    if (!call || this.core.turns.isBusy(sessionId)) return;
    this.core.track(
      this.drainPendingResults(call.child, call.scope, call.progress).then((outcome) => {
        if (outcome.kind === "failed") throw outcome.cause;
      }),
    );
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
          return { kind: "failed", resultId: delivered[0], reason, cause: turnFailureCause(outcome, reason) };
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

  /**
   * The asynchronous host contracts of a result's preparation: the inline-byte limit, then (only for an
   * above-limit body) the recipient's captured output writer. Both are awaited; a rejection is typed.
   */
  async #writerFor(
    recipient: { sessionId: string; principalAccountId: string },
    body: string,
  ): Promise<{ inlineBytes: number; spill: SpillStore }> {
    const limit = this.core.options.toolResultInlineBytes;
    const inlineBytes = limit
      ? await hostContract("tool_result_inline_bytes", limit)
      : DEFAULT_TOOL_RESULT_INLINE_BYTES;
    const capture = this.core.options.captureOutputWriter;
    if (!capture || Buffer.byteLength(body, "utf8") <= inlineBytes)
      return { inlineBytes, spill: this.core.options.spill };
    return { inlineBytes, spill: await hostContract("output_writer", () => capture(recipient)) };
  }

  /**
   * The one completion sink (emitDelegationCompletion): a sub-agent's result settles its run; a workflow
   * delivers one whole-workflow summary for its tool call, never its individual node results. Both are
   * prepared the same way (inline or spilled) before the inbox handoff; delivery then follows the parent's
   * state like any result. Returns the result id.
   */
  emitDelegationCompletion(completion: DelegationCompletion): Promise<string> {
    return this.core.writes.capture("a completion", () => this.#emitCompletion(completion));
  }

  async #emitCompletion(completion: DelegationCompletion): Promise<string> {
    if (completion.kind === "subagent") {
      const run = await this.core.repo.getRun(completion.runId, completion.principalAccountId);
      return this.#settleNow(run, completion.outcome, completion.body);
    }
    const resultId = randomUUID();
    const prepared = await prepareCompletion({
      repo: this.core.repo,
      ...(await this.#writerFor(
        { sessionId: completion.parentSessionId, principalAccountId: completion.principalAccountId },
        completion.summary,
      )),
      recipient: {
        sessionId: completion.parentSessionId,
        principalAccountId: completion.principalAccountId,
        fileName: `${resultId}.txt`,
      },
      readHint: SUMMARY_READ_HINT,
      outcome: completion.outcome,
      body: completion.summary,
    });
    const queued = await this.core.repo.enqueueWorkflowSummary({
      resultId,
      parentSessionId: completion.parentSessionId,
      principalAccountId: completion.principalAccountId,
      toolCallId: completion.toolCallId,
      outcome: prepared.outcome,
      body: prepared.body,
      byteSize: prepared.byteSize,
      ...(prepared.spillId ? { spillId: prepared.spillId } : {}),
    });
    if (queued.created) {
      await this.core.resultQueued(
        completion.parentSessionId,
        completion.principalAccountId,
        queued.resultId,
      );
      this.resultTurnFor(completion.parentSessionId);
    }
    return queued.resultId;
  }

  /**
   * A workflow's summary prepared for its parent's inbox as any result is: inline up to the limit, else the
   * whole of it spilled for the parent and a placeholder in its place. The file is named by the summary's
   * content, so a delivery retried after a crash writes the same file.
   */
  async prepareSummary(
    recipient: { sessionId: string; principalAccountId: string },
    workflowId: string,
    summary: string,
    outcome: "ok" | "error",
  ): Promise<PreparedCompletion> {
    const digest = createHash("sha256").update(summary).digest("hex").slice(0, 16);
    return prepareCompletion({
      repo: this.core.repo,
      ...(await this.#writerFor(recipient, summary)),
      recipient: { ...recipient, fileName: `workflow-${workflowId}-${digest}.txt` },
      readHint: SUMMARY_READ_HINT,
      outcome,
      body: summary,
    });
  }

  /** A result publication: captured, so the restart checkpoint lets one in flight commit. */
  #settle: Settle = (run, outcome, body, code, dropSteers, progress) =>
    this.core.writes.capture("a result publication", () =>
      this.#settleNow(run, outcome, body, code, dropSteers, progress),
    );

  async #settleNow(
    run: SubagentRun,
    outcome: "ok" | "error",
    body: string,
    code?: string,
    dropSteers?: string,
    progress?: RunProgressSnapshot,
  ): Promise<string> {
    const prepared = await prepareCompletion({
      repo: this.core.repo,
      ...(await this.#writerFor(
        { sessionId: run.parentSessionId, principalAccountId: run.principalAccountId },
        body,
      )),
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
    const resultId = randomUUID();
    const emitter = this.core.options.completionEmitter;
    if (emitter) {
      // Background completion awaits the host's completion emitter before the inbox handoff. The row's
      // mode now: Ctrl+B may have made a foreground call a background one.
      const current = await this.core.repo.getRun(run.id, run.principalAccountId);
      if (current.mode === "background" && OPEN_RUN_STATUSES.includes(current.status)) {
        await hostContract("completion_emitter", () =>
          emitter({
            runId: run.id,
            resultId,
            parentSessionId: run.parentSessionId,
            childSessionId: run.childSessionId,
            principalAccountId: run.principalAccountId,
            toolCallId: run.toolCallId,
            outcome: prepared.outcome,
            body: prepared.body,
            byteSize: prepared.byteSize,
          }),
        );
      }
    }
    const settled = await this.core.repo.settleRun({
      runId: run.id,
      generation: run.generation,
      resultId,
      outcome: prepared.outcome,
      body: prepared.body,
      byteSize: prepared.byteSize,
      ...(prepared.spillId ? { spillId: prepared.spillId } : {}),
      ...(error ? { error } : {}),
      ...(dropSteers !== undefined && { dropSteers }),
      ...(progress && { progress: { seq: progress.seq, snapshot: JSON.stringify(progress) } }),
      parentSessionId: run.parentSessionId,
    });
    faultPoint("child.settled");
    // The row's mode now, not when the call began: Ctrl+B may have moved a foreground call to the background.
    // A background call stays one (Ctrl+B is the only mode change), so only a foreground one is re-read.
    const mode =
      settled.settled && run.mode === "foreground"
        ? (await this.core.repo.getRun(run.id, run.principalAccountId)).mode
        : run.mode;
    if (mode === "background" || !this.core.turns.isStreaming(run.parentSessionId)) {
      await this.core.resultQueued(run.parentSessionId, run.principalAccountId, settled.resultId);
    } else {
      this.core.notifier.notify(run.parentSessionId);
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

/**
 * A journal read whole before a call's start, with the row the start appended: the journal as it is now,
 * when that row took the seq that came next (nothing else was written in between), else unknown.
 */
function withStartRow(
  before: { journal: JournalDelta; nextSeq: number } | undefined,
  row: JournalEntry | undefined,
): JournalDelta | undefined {
  if (!before || !row || row.seq !== before.nextSeq) return undefined;
  return { ...before.journal, entries: [...before.journal.entries, row] };
}
