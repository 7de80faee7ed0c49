import type { TurnHost, TurnOutcome, TurnRequest } from "@crw/brain";
import { buildIdentityOf } from "./buildIdentity.js";
import { type Clock, systemClock } from "./clock.js";
import {
  DelegationAbortedError,
  RunnerStartupCancelledError,
  RunnerStartupError,
  RunnerUnavailableError,
  toError,
} from "./errors.js";
import { FairQueue } from "./fairQueue.js";
import { HostRpcRefusedError } from "./hostRpc.js";
import type {
  PoolEvent,
  PoolHealth,
  ProcessChangedSink,
  ProviderUsageSink,
  ResultDeliveredSink,
  RetryProgress,
  RunnerExitTokensSink,
  RunnerPoolSizing,
  SpawnFailure,
  SteerSettledSink,
  SubagentRunnerPoolDeps,
} from "./poolTypes.js";
import type { DelegatedTurnRequest, DelegatedTurnResult, TapEvent } from "./protocol/turn.js";
import { type RestartRequiredSink, restartRequiredAlert } from "./restartAlert.js";
import { startupRetryDelayMs } from "./retryPolicy.js";
import { resolveRunnerEntry } from "./runnerEntry.js";
import {
  type HostRpcHandler,
  type SessionTurnMeta,
  SubagentRunnerHost,
  type TapHandle,
} from "./runnerHost.js";

interface Slot {
  readonly host: SubagentRunnerHost;
  turns: number;
  nestedTurns: number;
}

/** What placement needs to know about a turn, whatever kind of turn it is. */
export interface TurnPlacement {
  readonly turnId: string;
  /** The parent's channel: fairness key and unit of abort. */
  readonly channelId: string;
  readonly sessionId: string;
  readonly parentSessionId?: string;
}

interface Waiting {
  readonly request: TurnPlacement;
  readonly controller: AbortController;
  readonly run: (host: SubagentRunnerHost, signal: AbortSignal) => Promise<unknown>;
  readonly resolve: (result: unknown) => void;
  readonly reject: (error: Error) => void;
  readonly detach: () => void;
}

export type SessionPlacementState = "queued" | "running";

/** Effective runner count of one sizing snapshot: operator maximum, bounded by memory when configured. */
export function effectiveRunners(sizing: RunnerPoolSizing): number {
  let n = Math.max(0, Math.floor(sizing.maxRunners));
  if (
    sizing.memoryBudgetBytes !== undefined &&
    sizing.runnerMemoryBytes !== undefined &&
    sizing.runnerMemoryBytes > 0
  ) {
    n = Math.min(n, Math.floor(sizing.memoryBudgetBytes / sizing.runnerMemoryBytes));
  }
  return n;
}

/**
 * The runner pool: allocation and growth of runner processes, a fair admission queue, session routing and
 * the one serialized startup episode.
 *
 * Admission: a turn takes a free slot (its routed runner first, then a runner hosting its parent session,
 * then any) or waits in the FairQueue, keyed by the parent channel; when every runner is full and sizing
 * allows another, the pool grows through a startup episode. A queued turn is reported "queued" until it
 * is dispatched; aborting its channel removes it with DelegationAbortedError before it ever runs.
 *
 * Startup episode: original attempt plus maxRetries of the policy revision pinned at its start, waiting
 * startupRetryDelayMs between attempts on the pool's clock, the build identity captured once. Ready ends
 * it. Failure, exhaustion or cancellation is terminal for this pool (its target and build): later capacity
 * requests are refused with the same typed category, across reset and mode toggles. A build mismatch also
 * latches, blocking every further fork, and raises the restart-required alert once.
 */
export class SubagentRunnerPool {
  readonly #slots = new Map<string, Slot>();
  readonly #routes = new Map<string, string>();
  readonly #queue = new FairQueue<Waiting>();
  readonly #states = new Map<string, SessionPlacementState>();
  readonly #running = new Map<string, Waiting>();
  readonly #clock: Clock;
  #entry: string | undefined;
  #episode: { controller: AbortController; done: Promise<void> } | undefined;
  #startupRetry: RetryProgress | null = null;
  #spawnFailure: SpawnFailure | null = null;
  #terminal: RunnerStartupError | RunnerStartupCancelledError | undefined;
  #mismatchLatched = false;
  #alerted = false;
  #generation = 0;
  #closed = false;
  #runnerSeq = 0;
  #restartSink: RestartRequiredSink | undefined;
  #resultSink: ResultDeliveredSink | undefined;
  #exitTokensSink: RunnerExitTokensSink | undefined;
  #steerSink: SteerSettledSink | undefined;
  #processSink: ProcessChangedSink | undefined;
  #usageSink: ProviderUsageSink | undefined;

  constructor(private readonly deps: SubagentRunnerPoolDeps) {
    this.#clock = deps.clock ?? systemClock;
  }

  attachRestartRequiredSink(sink: RestartRequiredSink): void {
    this.#restartSink = sink;
  }
  attachResultDeliveredSink(sink: ResultDeliveredSink): void {
    this.#resultSink = sink;
  }
  attachRunnerExitTokensSink(sink: RunnerExitTokensSink): void {
    this.#exitTokensSink = sink;
  }
  attachSteerSettledSink(sink: SteerSettledSink): void {
    this.#steerSink = sink;
  }
  attachProcessChangedSink(sink: ProcessChangedSink): void {
    this.#processSink = sink;
  }
  attachProviderUsageSink(sink: ProviderUsageSink): void {
    this.#usageSink = sink;
  }

  /**
   * Where a session executes now, from the pool's own route bookkeeping: the runner it is routed to and its
   * placement state (queued, running, or routed and idle). Undefined: no runner hosts it.
   */
  executionOf(
    sessionId: string,
  ): { runnerId: string | null; state: "queued" | "running" | "idle" } | undefined {
    const runnerId = this.#routes.get(sessionId);
    const state = this.#states.get(sessionId);
    if (runnerId === undefined && state === undefined) return undefined;
    return { runnerId: runnerId ?? null, state: state ?? "idle" };
  }

  /** Every session the pool routes or queues, with its execution (see executionOf). */
  executions(): { sessionId: string; runnerId: string | null; state: "queued" | "running" | "idle" }[] {
    const ids = new Set([...this.#routes.keys(), ...this.#states.keys()]);
    return [...ids].flatMap((sessionId) => {
      const e = this.executionOf(sessionId);
      return e ? [{ sessionId, ...e }] : [];
    });
  }

  /** Whether the runners have the shared reverse host-call handler (takes no method argument). */
  supportsHostRpc(): boolean {
    return this.deps.hostRpc !== undefined;
  }

  /** The operator's switch: false, or a maximum of zero, means daemon-local execution. */
  usable(): boolean {
    const sizing = this.deps.sizing();
    return (this.deps.enabled?.() ?? true) && sizing.maxRunners > 0;
  }

  sessionState(sessionId: string): SessionPlacementState | undefined {
    return this.#states.get(sessionId);
  }

  routeOf(sessionId: string): string | undefined {
    return this.#routes.get(sessionId);
  }

  /**
   * Run one delegated turn in a runner. Waits in the fair queue when every runner is full. A failed turn is
   * rejected to the caller and never replayed; a startup failure is a typed RunnerStartupError.
   */
  runTurn(
    request: DelegatedTurnRequest,
    options: { signal?: AbortSignal; onProgress?: (text: string) => void } = {},
  ): Promise<DelegatedTurnResult> {
    return this.#admit(
      request,
      (host, signal) =>
        host.runTurn(request, { signal, ...(options.onProgress && { onProgress: options.onProgress }) }),
      options.signal,
    );
  }

  /**
   * Run a delegation-core session turn (brain's SessionTurnRunner seam) in a runner, with the same
   * admission, queueing, routing and failure rules as any delegated turn.
   */
  runSessionTurn(request: TurnRequest, turnHost: TurnHost, meta: SessionTurnMeta): Promise<TurnOutcome> {
    const placement: TurnPlacement = {
      turnId: meta.turnId,
      channelId: meta.channelId,
      sessionId: request.sessionId,
      ...(meta.parentSessionId !== undefined && { parentSessionId: meta.parentSessionId }),
    };
    return this.#admit(
      placement,
      (host, signal) => host.runSessionTurn(request, turnHost, meta, signal),
      request.signal,
    );
  }

  #admit<T>(
    request: TurnPlacement,
    run: (host: SubagentRunnerHost, signal: AbortSignal) => Promise<T>,
    signal: AbortSignal | undefined,
  ): Promise<T> {
    const refusal = this.#admissionRefusal();
    if (refusal) return Promise.reject(refusal);
    if (signal?.aborted) return Promise.reject(new DelegationAbortedError(request.channelId));
    return new Promise<T>((resolve, reject) => {
      const controller = new AbortController();
      const onAbort = () => this.#abortOne(waiting);
      signal?.addEventListener("abort", onAbort, { once: true });
      const waiting: Waiting = {
        request,
        controller,
        run,
        resolve: resolve as (result: unknown) => void,
        reject,
        detach: () => signal?.removeEventListener("abort", onAbort),
      };
      this.#queue.push(request.channelId, waiting);
      this.#states.set(request.sessionId, "queued");
      this.deps.onEvent?.({ type: "turn_queued", turnId: request.turnId, channelId: request.channelId });
      this.#pump();
    });
  }

  /** Abort a parent channel: its queued turns never run (DelegationAbortedError); running ones are stopped. */
  abortChannel(channelId: string): number {
    const queued = this.#queue.removeProducer(channelId);
    for (const w of queued) this.#rejectQueued(w, new DelegationAbortedError(channelId));
    for (const w of this.#running.values()) if (w.request.channelId === channelId) w.controller.abort();
    return queued.length;
  }

  /** A live read-only view of a routed child; undefined when no runner hosts it (view it in the daemon). */
  async tap(
    sessionId: string,
    onEvent: (event: TapEvent) => void,
    history?: { before?: string; limit?: number },
  ): Promise<TapHandle | undefined> {
    const slot = this.#slotOfSession(sessionId);
    return slot ? slot.host.tap(sessionId, onEvent, history) : undefined;
  }

  /**
   * Hand a session back (to daemon execution, or to retire a stale route). Released drops the route; a busy
   * or failed reply keeps it, so routing stays truthful.
   */
  async release(sessionId: string): Promise<"released" | "busy" | "failed"> {
    const slot = this.#slotOfSession(sessionId);
    if (!slot) {
      this.#routes.delete(sessionId);
      return "released";
    }
    const state = await slot.host.release(sessionId);
    if (state === "released" && this.#routes.get(sessionId) === slot.host.runnerId)
      this.#routes.delete(sessionId);
    return state;
  }

  /** Publish a new model catalog to every ready runner. */
  async publishCatalog(): Promise<void> {
    const catalog = this.deps.catalog();
    await Promise.all([...this.#slots.values()].map((s) => s.host.publishCatalog(catalog).catch(() => {})));
  }

  /**
   * Reset (mode toggle, reconfiguration): abort a pending startup, hand every routed session back and retire
   * runners. A terminal startup outcome and spawnFailure survive it.
   */
  async reset(): Promise<void> {
    this.#generation += 1;
    this.#episode?.controller.abort(new RunnerStartupCancelledError("runner startup cancelled by reset"));
    await Promise.all([...this.#routes.keys()].map((s) => this.release(s)));
    await Promise.all(
      [...this.#slots.values()].filter((s) => s.turns === 0).map((s) => s.host.shutdown().catch(() => {})),
    );
  }

  async close(): Promise<void> {
    this.#closed = true;
    this.#generation += 1;
    this.#episode?.controller.abort(new RunnerStartupCancelledError("runner pool closed"));
    for (const w of this.#queue.removeWhere(() => true)) {
      this.#rejectQueued(w, new RunnerUnavailableError("closed", "runner pool closed"));
    }
    await Promise.all([...this.#slots.values()].map((s) => s.host.shutdown().catch(() => {})));
  }

  health(): PoolHealth {
    const sizing = this.deps.sizing();
    const operatorDisabled = !(this.deps.enabled?.() ?? true) || sizing.maxRunners <= 0;
    const runners = [...this.#slots.values()].map((s) => {
      const load = s.host.stats().load;
      return {
        runnerId: s.host.runnerId,
        turns: s.turns,
        sessions: [...this.#routes.values()].filter((r) => r === s.host.runnerId).length,
        nestedTurns: s.nestedTurns,
        eventLoopP99Ms: load?.eventLoopP99Ms ?? null,
        memoryBytes: load?.memory.rssBytes ?? null,
        memoryComplete: load?.memory.complete ?? null,
      };
    });
    return {
      mode: operatorDisabled ? "in-process" : "runner",
      operatorDisabled,
      maxRunners: sizing.maxRunners,
      effectiveRunners: effectiveRunners(sizing),
      queued: this.#queue.size,
      turns: runners.reduce((n, r) => n + r.turns, 0),
      sessions: this.#routes.size,
      nestedTurns: runners.reduce((n, r) => n + r.nestedTurns, 0),
      runners,
      startupRetry: this.#startupRetry,
      spawnFailure: this.#spawnFailure,
      restartRequired: this.#mismatchLatched,
    };
  }

  #admissionRefusal(): Error | undefined {
    if (this.#closed) return new RunnerUnavailableError("closed", "runner pool closed");
    if (this.#mismatchLatched) {
      return new RunnerStartupError(
        "build_mismatch",
        "sub-agent runners need a daemon restart (build mismatch)",
      );
    }
    // A failed, exhausted or cancelled episode stays terminal: with no runner to wait for, refuse up front.
    if (this.#terminal && this.#slots.size === 0) return this.#terminal;
    if (effectiveRunners(this.deps.sizing()) === 0) {
      return new RunnerUnavailableError("no_capacity", "no sub-agent runner capacity (memory budget)");
    }
    return undefined;
  }

  #slotOfSession(sessionId: string): Slot | undefined {
    const runnerId = this.#routes.get(sessionId);
    return runnerId === undefined ? undefined : this.#slots.get(runnerId);
  }

  /** Dispatch queued turns while there are free slots; grow when full and sizing allows. */
  #pump(): void {
    const sizing = this.deps.sizing();
    const perRunner = Math.max(1, sizing.turnsPerRunner);
    while (this.#queue.size > 0) {
      const free = [...this.#slots.values()].filter((s) => s.host.isReady && s.turns < perRunner);
      if (free.length === 0) break;
      const waiting = this.#queue.shift() as Waiting;
      const { request } = waiting;
      const routed = this.#slotOfSession(request.sessionId);
      const parent = request.parentSessionId ? this.#slotOfSession(request.parentSessionId) : undefined;
      const slot =
        (routed && free.includes(routed) ? routed : undefined) ??
        (parent && free.includes(parent) ? parent : undefined) ??
        free.reduce((a, b) => (b.turns < a.turns ? b : a));
      this.#dispatch(slot, waiting);
    }
    if (
      this.#queue.size > 0 &&
      !this.#episode &&
      !this.#terminal &&
      this.#slots.size < effectiveRunners(sizing)
    ) {
      this.#grow();
    }
  }

  #dispatch(slot: Slot, waiting: Waiting): void {
    const { request } = waiting;
    // A nested edge counts only when parent and child sessions are both routed to this runner.
    const nested =
      request.parentSessionId !== undefined &&
      this.#routes.get(request.parentSessionId) === slot.host.runnerId;
    slot.turns += 1;
    if (nested) slot.nestedTurns += 1;
    this.#routes.set(request.sessionId, slot.host.runnerId);
    this.#states.set(request.sessionId, "running");
    this.#running.set(request.turnId, waiting);
    this.deps.onEvent?.({
      type: "turn_dispatched",
      turnId: request.turnId,
      runnerId: slot.host.runnerId,
      nested,
    });
    // Bookkeeping settles before the caller resumes, so counts and states are exact when it looks.
    const settle = () => {
      waiting.detach();
      slot.turns -= 1;
      if (nested) slot.nestedTurns -= 1;
      this.#running.delete(request.turnId);
      if (![...this.#running.values()].some((w) => w.request.sessionId === request.sessionId)) {
        this.#states.delete(request.sessionId);
      }
      queueMicrotask(() => this.#pump());
    };
    waiting.run(slot.host, waiting.controller.signal).then(
      (result) => {
        settle();
        waiting.resolve(result);
      },
      (e) => {
        settle();
        waiting.reject(toError(e));
      },
    );
  }

  #abortOne(waiting: Waiting): void {
    if (this.#running.has(waiting.request.turnId)) {
      waiting.controller.abort();
      return;
    }
    const removed = this.#queue.removeWhere((w) => w === waiting);
    for (const w of removed) this.#rejectQueued(w, new DelegationAbortedError(w.request.channelId));
  }

  #rejectQueued(waiting: Waiting, error: Error): void {
    waiting.detach();
    if (this.#states.get(waiting.request.sessionId) === "queued")
      this.#states.delete(waiting.request.sessionId);
    waiting.reject(error);
  }

  #grow(): void {
    const controller = new AbortController();
    const done = this.#runEpisode(controller.signal)
      .then((host) => this.#adopt(host))
      .catch((e) => this.#episodeFailed(toError(e)))
      .finally(() => {
        this.#episode = undefined;
        this.#startupRetry = null;
        this.#pump();
      });
    this.#episode = { controller, done };
  }

  async #runEpisode(signal: AbortSignal): Promise<SubagentRunnerHost> {
    const generation = this.#generation;
    const source = this.deps.retryPolicySource();
    const policy = await source.read(); // pinned for the whole episode
    this.#entry ??= this.deps.entry ?? resolveRunnerEntry();
    const buildId = this.deps.buildId ?? buildIdentityOf(this.#entry);
    let last: RunnerStartupError | undefined;
    for (let attempt = 0; attempt <= policy.maxRetries; attempt++) {
      if (attempt > 0) {
        const delay = startupRetryDelayMs(policy, attempt);
        this.#startupRetry = { attempt, maxRetries: policy.maxRetries, state: "waiting", nextDelayMs: delay };
        await this.#clock.sleep(delay, signal);
      }
      if (signal.aborted) throw signal.reason;
      this.#startupRetry = { attempt, maxRetries: policy.maxRetries, state: "starting", nextDelayMs: null };
      this.#runnerSeq += 1;
      try {
        return await SubagentRunnerHost.start({
          runnerId: `runner-${this.#runnerSeq}`,
          entry: this.#entry,
          buildId,
          retryPolicySource: source,
          catalog: this.deps.catalog(),
          ...(this.deps.agentOptions && { agentOptions: this.deps.agentOptions() }),
          isCurrent: () => generation === this.#generation && !signal.aborted,
          onEvent: (event) => this.#onHostEvent(event),
          ...pick(this.deps, [
            "bootTimeoutMs",
            "heartbeatIntervalMs",
            "env",
            "execArgv",
            "execPath",
            "procRoot",
            "localExec",
          ]),
          hostRpc: this.#hostRpcHandler(),
        });
      } catch (e) {
        // Unexpected errors propagate unchanged and are not recorded as a startup category.
        if (!(e instanceof RunnerStartupError)) throw e;
        last = e;
        this.deps.onEvent?.({ type: "startup_failed", attempt, category: e.category });
        if (e.category === "build_mismatch") throw e;
        this.#spawnFailure = { category: e.category, state: "retrying" };
      }
    }
    throw last ?? new RunnerStartupError("boot_failed", "runner startup failed");
  }

  #adopt(host: SubagentRunnerHost): void {
    // Only application-ready startup clears spawnFailure.
    this.#spawnFailure = null;
    this.#slots.set(host.runnerId, { host, turns: 0, nestedTurns: 0 });
    this.deps.onEvent?.({ type: "runner_ready", runnerId: host.runnerId });
    this.#emitProcessChanged({ runnerId: host.runnerId, state: "started" });
  }

  #episodeFailed(error: Error): void {
    if (error instanceof RunnerStartupCancelledError) {
      this.#terminal = error;
      this.#spawnFailure = { category: "cancelled", state: "cancelled" };
    } else if (error instanceof RunnerStartupError) {
      this.#terminal = error;
      if (error.category === "build_mismatch") {
        this.#mismatchLatched = true;
        this.#spawnFailure = { category: "build_mismatch", state: "latched" };
        this.#raiseRestartRequired();
      } else {
        this.#spawnFailure = { category: error.category, state: "exhausted" };
      }
    }
    // With no runner left to wait for, queued turns get the startup error now (typed, never replayed).
    if (this.#slots.size === 0) {
      for (const w of this.#queue.removeWhere(() => true)) this.#rejectQueued(w, error);
    }
  }

  #raiseRestartRequired(): void {
    if (this.#alerted || !this.#restartSink) return;
    this.#alerted = true;
    const sink = this.#restartSink;
    Promise.resolve()
      .then(() => sink(restartRequiredAlert))
      .catch((e) => this.deps.onEvent?.({ type: "alert_failed", error: toError(e).message }));
  }

  #onHostEvent(event: import("./runnerHost.js").RunnerHostEvent): void {
    switch (event.type) {
      case "exit": {
        const slot = this.#slots.get(event.runnerId);
        this.#slots.delete(event.runnerId);
        for (const [session, runner] of [...this.#routes])
          if (runner === event.runnerId) this.#routes.delete(session);
        const tokens = slot?.host.containment?.killTokens;
        if (tokens && tokens.length > 0)
          this.#exitTokensSink?.({ runnerId: event.runnerId, killTokens: tokens });
        this.deps.onEvent?.({
          type: "runner_exited",
          runnerId: event.runnerId,
          code: event.code,
          signal: event.signal,
        });
        // Only a runner the pool adopted was announced as started; a failed boot attempt never was.
        if (slot)
          this.#emitProcessChanged({
            runnerId: event.runnerId,
            state: "exited",
            code: event.code,
            signal: event.signal,
          });
        queueMicrotask(() => this.#pump());
        return;
      }
      case "frame_refused":
        this.deps.onEvent?.({ type: "frame_refused", runnerId: event.runnerId, issues: event.issues });
        return;
      case "measure_failed":
        this.deps.onEvent?.({ type: "measure_failed", runnerId: event.runnerId, message: event.message });
        return;
      case "stderr":
        this.deps.onEvent?.({ type: "runner_log", runnerId: event.runnerId, line: event.line });
        return;
      case "steer_settled": {
        const { runnerId, sessionId, count } = event;
        this.#toSink("steerSettled", this.#steerSink, { runnerId, sessionId, count });
        return;
      }
      case "provider_usage": {
        const { runnerId, sessionId, turnId, usage } = event;
        this.#toSink("providerUsage", this.#usageSink, { runnerId, sessionId, turnId, usage });
        return;
      }
      case "heartbeat":
        return;
    }
  }

  #emitProcessChanged(change: Parameters<ProcessChangedSink>[0]): void {
    this.#toSink("processChanged", this.#processSink, change);
  }

  /** Hand a fact to an attached sink; a throwing sink is reported (sink_failed), never propagated. */
  #toSink<T>(
    name: Extract<PoolEvent, { type: "sink_failed" }>["sink"],
    sink: ((value: T) => void) | undefined,
    value: T,
  ): void {
    if (!sink) return;
    try {
      sink(value);
    } catch (e) {
      this.deps.onEvent?.({ type: "sink_failed", sink: name, error: toError(e).message });
    }
  }

  /** The pool's wrapper of the daemon handler: delegation.resultDelivered only from the parent's runner. */
  #hostRpcHandler(): HostRpcHandler {
    return async (method, params, context) => {
      if (method !== "delegation.resultDelivered") {
        if (!this.deps.hostRpc)
          throw new HostRpcRefusedError("unsupported", `no daemon handler for ${method}`);
        return this.deps.hostRpc(method, params, context);
      }
      const delivery = params as Parameters<ResultDeliveredSink>[0];
      if (this.#routes.get(delivery.parentSessionId) !== context.runnerId) {
        throw new HostRpcRefusedError(
          "not_routed",
          "delegation.resultDelivered refused: the parent session is not routed to this runner",
        );
      }
      if (!this.#resultSink) return { published: false };
      await this.#resultSink(delivery);
      return { published: true };
    };
  }
}

function pick<T extends object, K extends keyof T>(o: T, keys: K[]): Partial<Pick<T, K>> {
  const out: Partial<Pick<T, K>> = {};
  for (const k of keys) if (o[k] !== undefined) out[k] = o[k];
  return out;
}
