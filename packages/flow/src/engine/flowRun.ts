import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { runAppServerCall } from "../backends/appServer.js";
import { decide } from "../backends/decision.js";
import { runLocalCall } from "../backends/local.js";
import { noSessionHost } from "../backends/noHost.js";
import { worktreePath } from "../git/worktree.js";
import type { HostThread, SessionHost } from "../host/sessionHost.js";
import type { JournalStats, JournalWriter } from "../journal/journal.js";
import type { JournalRow, NewRow, Pair, RowOf, Tokens } from "../journal/rows.js";
import { readCancelRequest } from "../run/cancelRequest.js";
import { readCodexSettings } from "../run/codexConfig.js";
import type { RunPaths } from "../run/paths.js";
import type { RoleName, RoleTable } from "../run/roles.js";
import type { RunSpec } from "../run/spec.js";
import { markerInText } from "../steps/message.js";
import { FileStepBus, type StepWriteHook } from "../steps/stepBus.js";
import { digestOf } from "../util/canonical.js";
import { FlowError } from "../util/errors.js";
import { foldCall } from "./callFold.js";
import { continuationOf } from "./continuation.js";
import { closeAgent } from "./harvestTurn.js";
import { HostHealth } from "./hostHealth.js";
import { ledgerSpawnsOf } from "./ledgerJoin.js";
import { RefusalBound } from "./refusals.js";
import { answerStrayReports } from "./reports.js";
import type { RunBranch } from "./runBranch.js";
import { type FlowEvent, type RunContext, RunStopped } from "./runContext.js";
import { RunWaits } from "./runWaits.js";
import { runSessionCall } from "./sessionCall.js";
import { TokenFigure, tokenTotal } from "./tokenFigure.js";
import { CallTracer } from "./trace.js";
import { DEFAULT_WAKE, OwnerWaker } from "./wake.js";
import {
  type CallOptions,
  type CallOutcome,
  type CallWork,
  callInput,
  type FlowContext,
  loadWorkflow,
  type NormalizedCall,
  normalizeCall,
  type Workflow,
} from "./workflow.js";
import { placeWorktree } from "./workspace.js";

export interface FlowRunOptions {
  paths: RunPaths;
  spec: RunSpec;
  /** The session host; a local run has none (a use of it is an error). */
  host?: SessionHost;
  /** The process lock token this process holds, or null when it could not take one. */
  processToken: string | null;
  workflow?: Workflow;
  /** The workflow module to run instead of the run's own (`crw flow resume RUN SCRIPT`). */
  workflowPath?: string;
  onEvent?: (event: FlowEvent) => void;
  /** Test seam: a write of a step file that fails (a full disk). */
  stepWriteHook?: StepWriteHook;
  env?: NodeJS.ProcessEnv;
  /** Called once with the journal writer's figures when this process's part of the run is over. */
  onStats?: (stats: JournalStats) => void;
  /** The run's token ceiling (total tokens); overrides the spec's token_ceiling. */
  tokenCeiling?: number;
  /** Called once when this process's part of the run is over: the run's figure and this process's spent(). */
  onTokens?: (figure: { run: Tokens; spent: Tokens }) => void;
}

export type FlowRunOutcome =
  | { state: "completed"; result: unknown }
  | { state: "failed"; error: string }
  | { state: "paused"; reason: string }
  | { state: "cancelled"; reason: string };

/** The stop reason of a run `crw flow cancel` ended. */
export const CANCELLED = "cancelled";

/** The backend a journal records: its newest started row's, and a started row with none is app-server. */
export function startedBackend(rows: readonly JournalRow[]): "session" | "app-server" | "local" | null {
  for (let i = rows.length - 1; i >= 0; i--) {
    const r = rows[i];
    if (r?.type === "started") return r.backend ?? "app-server";
  }
  return null;
}

/** SessionConfig.LostAfter: how long a bound subagent may show no change before its attempt is lost. */
export const DEFAULT_LOST_AFTER_MS = 10 * 60_000;

/** A small counting semaphore: the run's pool of calls in flight. */
class Pool {
  private free: number;
  private readonly waiters: Array<() => void> = [];
  constructor(size: number) {
    this.free = size;
  }
  async acquire(): Promise<void> {
    if (this.free > 0) {
      this.free--;
      return;
    }
    await new Promise<void>((r) => this.waiters.push(r));
  }
  release(): void {
    const w = this.waiters.shift();
    if (w) w();
    else this.free++;
  }
}

/** One run process's run: the workflow's calls, their pool, and the stop that ends them. */
export class FlowRun implements RunContext {
  readonly runId: string;
  readonly owner: string;
  readonly paths: RunPaths;
  readonly spec: RunSpec;
  readonly host: SessionHost;
  readonly bus: FileStepBus;
  readonly pollMs: number;
  readonly lostAfterMs: number;
  readonly lookupEveryMs: number;
  stopping: { reason: string } | null = null;
  readonly hostHealth: HostHealth;
  readonly refusals: RefusalBound = new RefusalBound(this);
  /** The run's branch; null when the repository is no git checkout. */
  branch: RunBranch | null = null;
  private waker: OwnerWaker | null = null;
  tracer: CallTracer | null = null;
  private fatal: FlowError | null = null;
  private readonly byCall = new Map<string, JournalRow[]>();
  private readonly counters = new Map<string, number>();
  private readonly active = new Set<Promise<unknown>>();
  private readonly pool: Pool;
  private ownerCache: { at: number; value: ReturnType<SessionHost["readThread"]> } | null = null;
  private stopWaiters: Array<() => void> = [];
  private readonly stopController = new AbortController();
  /** Set once the run takes a cancel request: it ends cancelled, whatever else stopped it. */
  private cancelled: { reason: string } | null = null;
  private cancelTaking: Promise<void> | null = null;
  /**
   * A request an earlier process journaled (read once: the run's loop looks on every round, and the one
   * this process journals sets `cancelled` itself).
   */
  private readonly cancelOnOpen: RowOf<"cancel_requested"> | null;
  private readonly waits: RunWaits;
  readonly tokens: TokenFigure;

  constructor(
    private readonly opts: FlowRunOptions,
    readonly journal: JournalWriter,
    readonly table: RoleTable,
    readonly pins: Record<RoleName, Pair>,
  ) {
    this.paths = opts.paths;
    this.spec = opts.spec;
    this.runId = opts.spec.run_id;
    if (!opts.spec.owner && opts.spec.backend === "session")
      throw new FlowError("input", "a session run needs an owner thread", 2);
    this.owner = opts.spec.owner ?? "";
    this.hostHealth = new HostHealth({
      hostSpec: opts.spec.host,
      env: opts.env ?? process.env,
      rows: () => this.journal.rows,
      append: (rows) => this.append(rows),
    });
    // the session backend's host answers are watched: an owner's host crw cannot reach is said, with why
    this.host =
      opts.host && opts.spec.backend === "session"
        ? this.hostHealth.watch(opts.host)
        : (opts.host ?? noSessionHost(opts.spec.backend));
    this.bus = new FileStepBus(opts.paths.steps, opts.stepWriteHook ?? null);
    this.pollMs = opts.spec.poll_ms ?? 500;
    this.lostAfterMs = opts.spec.lost_after_ms ?? DEFAULT_LOST_AFTER_MS;
    this.lookupEveryMs = Math.max(this.pollMs * 4, 1000);
    this.waits = new RunWaits({ inbox: opts.paths.inbox, replies: opts.paths.replies }, this.pollMs);
    // a session run keeps one of agents.max_threads for the owner's own helper, whatever --pool said
    const slots =
      opts.spec.backend === "session"
        ? Math.max(1, readCodexSettings(opts.env ?? process.env).maxThreads - 1)
        : opts.spec.pool;
    this.pool = new Pool(Math.max(1, Math.min(opts.spec.pool, slots)));
    for (const row of journal.rows) this.index(row);
    if (opts.spec.trace && opts.spec.backend === "session") {
      this.tracer = new CallTracer({
        runId: this.runId,
        spec: opts.spec,
        state: opts.paths.state,
        rowsOf: (call) => this.rowsOf(call),
        append: (rows) => this.append(rows),
        emit: (event) => this.emit(event),
      });
    }
    if (opts.spec.backend === "session" && opts.spec.owner) {
      const stateFlag = ` --state ${opts.paths.state}`;
      this.waker = new OwnerWaker(
        {
          runId: this.runId,
          owner: opts.spec.owner,
          host: this.host,
          rows: () => this.journal.rows,
          append: (rows) => this.append(rows),
          nextCommand: `crw flow next ${this.runId}${stateFlag} --wait 10 --json`,
          hostVersion: (id) => this.waits.hostVersion(id),
          statusFreshMs: this.pollMs,
        },
        {
          wakeAfterMs: opts.spec.wake_after_ms ?? DEFAULT_WAKE.wakeAfterMs,
          renotifyMaxMs: opts.spec.renotify_max_ms ?? DEFAULT_WAKE.renotifyMaxMs,
          unresponsiveAfterMs: opts.spec.unresponsive_after_ms ?? DEFAULT_WAKE.unresponsiveAfterMs,
        },
      );
    }
    this.tokens = new TokenFigure(journal.rows);
    const journaled = journal.rows.findLast((r) => r.type === "cancel_requested");
    this.cancelOnOpen = journaled?.type === "cancel_requested" ? journaled : null;
    journal.onDurable = (rows) => this.observe(rows);
  }

  private index(row: JournalRow): void {
    if (!("call" in row) || typeof row.call !== "string") return;
    const list = this.byCall.get(row.call);
    if (list) list.push(row);
    else this.byCall.set(row.call, [row]);
  }

  append(rows: NewRow[]): JournalRow[] {
    return this.journal.append(rows);
  }

  appendDurable(rows: NewRow[]): Promise<JournalRow[]> {
    return this.journal.appendDurable(rows);
  }

  /** A durable batch, whichever append wrote it: the calls' rows and the token figure follow it. */
  private observe(written: JournalRow[]): void {
    for (const r of written) this.index(r);
    this.tokens.observe(written);
  }

  rowsOf(call: string): readonly JournalRow[] {
    return this.byCall.get(call) ?? [];
  }

  threadCountBefore(threadId: string, call: string): Tokens | undefined {
    return this.tokens.threadCountBefore(threadId, call);
  }

  get stopSignal(): AbortSignal {
    return this.stopController.signal;
  }

  stop(reason: string): void {
    if (this.stopping) return;
    this.stopping = { reason };
    this.emit({ type: "stopping", reason });
    this.waits.stopped();
    this.stopController.abort();
    for (const w of this.stopWaiters.splice(0)) w();
  }

  emit(event: FlowEvent): void {
    this.waker?.onEvent(event);
    this.tracer?.onEvent(event);
    this.opts.onEvent?.(event);
  }

  nap(since?: number): Promise<void> {
    return this.waits.nap(since);
  }

  inboxVersion(): number {
    return this.waits.inboxVersion;
  }

  unanswered(): string[] {
    return this.waits.unanswered();
  }

  answered(name: string): void {
    this.waits.answered(name);
  }

  hostVersion(threadId: string): number {
    return this.waits.hostVersion(threadId);
  }

  hostNap(threadId: string, since: number): Promise<void> {
    return this.waits.hostNap(threadId, since);
  }

  async spawnedFor(marker: string): ReturnType<RunContext["spawnedFor"]> {
    const now = Date.now();
    // one read of the owner thread serves every waiting step for a lookup interval
    if (!this.ownerCache || now - this.ownerCache.at >= this.lookupEveryMs) {
      this.ownerCache = { at: now, value: this.host.readThread(this.owner) };
    }
    const owner = await this.ownerCache.value;
    if (!owner.ok) return owner;
    const ids = new Set<string>();
    for (const turn of owner.value.turns) {
      for (const item of turn.items) {
        if (item.type !== "collabAgentToolCall" || item.tool !== "spawnAgent" || !item.prompt) continue;
        if (markerInText(item.prompt) === marker) for (const id of item.receiverThreadIds) ids.add(id);
      }
    }
    const items = owner.value.turns.flatMap((t) => t.items);
    for (const id of ledgerSpawnsOf(this.paths.state, this.owner, items, marker)) ids.add(id);
    const threads: HostThread[] = [];
    for (const id of ids) {
      const t = await this.host.readThread(id);
      if (t.ok) threads.push(t.value);
    }
    return { ok: true, value: threads };
  }

  async execute(): Promise<FlowRunOutcome> {
    const workflow = this.opts.workflow ?? (await loadWorkflow(this.opts.workflowPath ?? this.spec.workflow));
    const ctx: FlowContext = {
      runId: this.runId,
      call: (o) => handled(this.call(o).then((c) => c.answer)) as never,
      callWithWork: (o) => handled(this.call(o)) as never,
      decide: (o) => decide(this, o),
    };
    this.waits.open(this.host);
    try {
      return await this.executeWatched(workflow, ctx);
    } finally {
      this.waits.close();
      this.opts.onTokens?.({ run: this.tokens.run(), spent: this.tokens.spent() });
    }
  }

  private async executeWatched(workflow: Workflow, ctx: FlowContext): Promise<FlowRunOutcome> {
    let pumping = true;
    const pump = (async () => {
      while (pumping) {
        const since = this.waits.inboxVersion;
        try {
          await this.takeCancelRequest();
          await answerStrayReports(this);
        } catch (e) {
          this.emit({ type: "warning", message: `inbox: ${(e as Error).message}` });
        }
        try {
          await this.waker?.tick();
        } catch (e) {
          this.emit({ type: "warning", message: `owner wake: ${(e as Error).message}` });
        }
        await this.waits.pumpNap(this.waker ? this.owner : null, since);
      }
    })();
    const stopped = new Promise<"stopped">((r) => this.stopWaiters.push(() => r("stopped")));
    let outcome: FlowRunOutcome;
    try {
      // a request journaled by a process that died, or left for this one: no call starts
      await this.takeCancelRequest();
      const result = await Promise.race([
        this.stopping ? ("stopped" as const) : workflow.run(ctx, this.spec.input),
        stopped,
      ]);
      if (result === "stopped" && this.stopping) throw new RunStopped(this.stopping.reason);
      if (this.fatal) throw this.fatal;
      outcome = { state: "completed", result };
    } catch (e) {
      if (!this.stopping && !this.fatal) {
        // the workflow itself failed (a call ended null_model and it did not catch it, or it threw)
        const message = (e as Error)?.message ?? String(e);
        this.append([{ type: "run_ended", status: "failed", error: message }]);
        outcome = { state: "failed", error: message };
      } else outcome = { state: "paused", reason: this.stopping?.reason ?? "stopped" };
    }
    await Promise.allSettled([...this.active]);
    // a cancel ends the run whatever else stopped it, or a workflow that went on past its stop
    if (this.cancelled && !this.fatal) outcome = await this.endCancelled(this.cancelled.reason);
    // every call in flight has its row now: the branch's open heads are merged (or the conflict recorded)
    if (outcome.state !== "paused") await this.endBranch();
    if (this.fatal) {
      pumping = false;
      await pump;
      throw this.fatal;
    }
    if (outcome.state === "completed") {
      this.append([{ type: "run_ended", status: "completed", result: outcome.result }]);
    } else if (outcome.state === "cancelled") {
      this.append([{ type: "run_ended", status: "cancelled", reason: outcome.reason }]);
    }
    pumping = false;
    await pump;
    return outcome;
  }

  /**
   * Takes a cancel request: the journal's (a process that died after it journaled one) or the request
   * file's, journaled durably before the run stops. Once taken, the run stops with no new call and ends
   * cancelled, even when something else stopped it first.
   */
  private takeCancelRequest(): Promise<void> {
    if (this.cancelled) return Promise.resolve();
    // the run's loop and its start may look at once: one of them journals the request, both wait for it
    this.cancelTaking ??= this.takeCancelRequestOnce().finally(() => {
      this.cancelTaking = null;
    });
    return this.cancelTaking;
  }

  private async takeCancelRequestOnce(): Promise<void> {
    let reason: string;
    if (this.cancelOnOpen) reason = this.cancelOnOpen.reason;
    else {
      const request = readCancelRequest(this.paths);
      if (!request) return;
      // too late for a run whose workflow has failed meanwhile: its end is written
      if (this.journal.rows.some((r) => r.type === "run_ended")) return;
      reason = request.reason;
      await this.appendDurable([{ type: "cancel_requested", reason, requested_at: request.at }]);
    }
    this.cancelled = { reason };
    this.stop(CANCELLED);
  }

  /**
   * A cancelled run's end: every call still open (one this process never reached, as after a resume) is
   * stopped the way its backend stops a call (a running turn interrupted, a waiting step retracted, the
   * call held), and the subagents the stop left bound get close steps, since no resume will settle them.
   */
  private async endCancelled(reason: string): Promise<FlowRunOutcome> {
    for (const [call, rows] of this.byCall) {
      if (!rows.some((r) => r.type === "prepared")) continue;
      if (foldCall(rows).position?.kind === "terminal") continue;
      await this.backendCall()(this, call).catch(() => {});
      if (this.spec.backend === "session") await closeAgent(this, call);
    }
    return { state: "cancelled", reason };
  }

  private backendCall(): (rc: RunContext, call: string) => Promise<unknown> {
    if (this.spec.backend === "local") return runLocalCall;
    return this.spec.backend === "app-server" ? runAppServerCall : runSessionCall;
  }

  /** A new call is not started once the run's figure has reached its token ceiling: the run pauses. */
  private checkCeiling(): void {
    const ceiling = this.opts.tokenCeiling ?? this.spec.token_ceiling;
    if (ceiling === undefined || tokenTotal(this.tokens.run()) < ceiling) return;
    this.append([{ type: "run_paused", reason: "token_ceiling" }]);
    this.stop("token_ceiling");
    throw new RunStopped("token_ceiling");
  }

  /**
   * The prepared row and P. In a git checkout P is a worktree of its own at the run branch's tip (after
   * merging what parallel calls left open); a merge that conflicts ends the call with the paths, before
   * any subagent is asked. Elsewhere P is the given directory or a scratch directory.
   */
  private async prepare(
    call: string,
    n: NormalizedCall,
    input: RowOf<"prepared">["input"],
    inputDigest: string,
  ): Promise<void> {
    const start = this.branch && !n.workspace ? await this.branch.startFor(call) : null;
    const workspace = start
      ? worktreePath(this.paths.workspaces, n.node, call)
      : (n.workspace ?? join(this.paths.workspaces, call));
    const allocation = start
      ? { workspace, kind: "worktree" as const, start: start.start }
      : { workspace, kind: n.workspace ? ("given" as const) : ("scratch" as const) };
    const prepared: NewRow = {
      type: "prepared",
      call,
      op: call,
      role: n.role,
      input,
      input_digest: inputDigest,
      backend: this.spec.backend,
      allocation,
    };
    if (start && !start.ok) {
      this.append([
        prepared,
        { type: "null_model", call, op: call, reason: "merge_conflict", errors: start.paths, tokens: {} },
      ]);
      this.emit({
        type: "call_ended",
        call,
        status: `null_model (merge_conflict: ${start.paths.join(", ")})`,
      });
      return;
    }
    await this.appendDurable([prepared]);
    // the placer makes P after the prepared row; a resumed call finds it (or makes it again)
    if (start) await placeWorktree(this.spec.repo, allocation);
    else mkdirSync(workspace, { recursive: true });
  }

  /** The run's end on its branch: a git failure there is a warning, never a run that does not end. */
  private async endBranch(): Promise<void> {
    await this.branch?.end().catch((e: Error) => this.branchWarning(e));
  }

  private branchWarning(e: Error): void {
    this.emit({ type: "warning", message: `run branch: ${e.message}` });
  }

  /** What a completed call changed, from its completed row. */
  private workOf(call: string): CallWork | null {
    const done = this.rowsOf(call).findLast((r) => r.type === "completed");
    return done?.type === "completed" ? (done.work ?? null) : null;
  }

  private async call(options: CallOptions): Promise<CallOutcome<unknown>> {
    if (this.stopping) throw new RunStopped(this.stopping.reason);
    const n = normalizeCall(options);
    const i = (this.counters.get(n.node) ?? 0) + 1;
    this.counters.set(n.node, i);
    const call = `${n.node}.${i}`;
    const input = callInput(n, n.resume ? continuationOf(this, call, n.role, n.resume, n.effort) : undefined);
    const inputDigest = digestOf(input);
    const fold = foldCall(this.rowsOf(call));
    if (fold.prepared && fold.prepared.input_digest !== inputDigest) {
      this.fatal = new FlowError(
        "digest_mismatch",
        `op ${call}: its input differs from the journal's (the workflow is not deterministic or was changed); the resume is refused`,
        2,
        { op: call },
      );
      this.stop(`digest_mismatch:${call}`);
      throw this.fatal;
    }
    const runCall = this.backendCall();
    const outcome = async () => ({ op: call, answer: await runCall(this, call), work: this.workOf(call) });
    if (fold.position?.kind === "terminal") return outcome();
    const p = (async () => {
      await this.pool.acquire();
      try {
        if (this.stopping) throw new RunStopped(this.stopping.reason);
        if (!fold.prepared) this.checkCeiling();
        if (!fold.prepared) await this.prepare(call, n, input, inputDigest);
        else if (fold.prepared.allocation.kind === "worktree") {
          await placeWorktree(this.spec.repo, fold.prepared.allocation);
        } else {
          mkdirSync(fold.prepared.allocation.workspace, { recursive: true });
        }
        const done = await outcome();
        // the call's commit on the branch (and its own ref) before the workflow hears of it; a ref that
        // cannot be moved now is moved when the next process starts (the rows say where it goes)
        await this.branch?.sync().catch((e: Error) => this.branchWarning(e));
        return done;
      } finally {
        this.pool.release();
      }
    })();
    this.active.add(p);
    p.then(
      () => this.active.delete(p),
      () => this.active.delete(p),
    );
    return p;
  }
}

/**
 * A workflow may leave a call's promise unawaited while it awaits another: when the run stops, that call's
 * rejection is part of the stop (the run ends with its row), never an unhandled rejection of the run's
 * process. The workflow still gets the rejection when it awaits it.
 */
function handled<T>(p: Promise<T>): Promise<T> {
  p.catch(() => {});
  return p;
}

export type { HostThread };
