import type { ChildTurnExecutor } from "./childTurn.js";
import { ProcessContainment } from "./containment.js";
import { DelegationAbortedError, SkillReviewSkippedError, toError } from "./errors.js";
import { HostRpcRefusedError } from "./hostRpc.js";
import type { SubagentRunnerPool } from "./pool.js";
import {
  assertProtectedDispatch,
  currentWorkflowNodeDispatch,
  matchesProtectedDispatch,
  outsideWorkflowNodeDispatch,
  retireRunnerRoute,
} from "./protectedPlacement.js";
import { hostRpcParamsSchemas } from "./protocol/hostRpcMethods.js";
import type { DelegatedTurnRequest, DelegatedTurnResult, TapEvent } from "./protocol/turn.js";
import { currentDispatchedTurn, outsideDispatchedTurn, runInDispatchedTurn } from "./rpcTurn.js";
import type { HostRpcHandler } from "./runnerHost.js";
import { SessionViews } from "./sessionViews.js";

/**
 * Whether ordinary delegated work would run in a runner: the explicit switch and the runner's optional
 * usable capability (absent pool, or an operator maximum of zero, is not usable).
 */
export function predictsRunnerDispatch(runner: { usable(): boolean } | undefined, enabled: boolean): boolean {
  return enabled && (runner?.usable() ?? false);
}

/** Holds the remote-call fence around one delegated call, for either mode, queue wait included. */
export type RemoteCallFence = <T>(request: DelegatedTurnRequest, work: () => Promise<T>) => Promise<T>;

export interface SubagentDispatchDeps {
  readonly pool?: SubagentRunnerPool;
  /** The daemon's own executor of a child turn (the rollback path). */
  readonly inProcess: ChildTurnExecutor;
  /** runtime.subagentRunnerEnabled, read per call so a change applies without redeploying; default true. */
  readonly runnerEnabled?: () => boolean;
  readonly fence?: RemoteCallFence;
  /** Reverse host-call handler for turns run in the daemon (runners reach the pool's instead). */
  readonly hostRpc?: HostRpcHandler;
}

export type Placement = "runner" | "in-process";

/**
 * The one decision between in-process execution and a runner process, and the one call site of both.
 *
 * - Runner mode unless `runtime.subagentRunnerEnabled` is false or the operator maximum is zero. A
 *   memory-derived zero capacity stays runner mode and is refused by the pool.
 * - The same fence wraps either mode, including the pool's queue wait.
 * - A failed turn is rejected to the caller and never replayed; a runner startup failure never falls back
 *   to the daemon's event loop.
 */
export class SubagentDispatch {
  /** Children that ran in the daemon, for read-only views without a routed runner. */
  readonly #localViews = new SessionViews((tapId, event) => this.#localTaps.get(tapId)?.(event));
  readonly #localTaps = new Map<string, (event: TapEvent) => void>();
  readonly #localControllers = new Map<string, { channelId: string; controller: AbortController }>();
  readonly #localProcesses = new ProcessContainment();
  #tapSeq = 0;

  constructor(private readonly deps: SubagentDispatchDeps) {}

  placement(): Placement {
    return predictsRunnerDispatch(this.deps.pool, this.deps.runnerEnabled?.() ?? true)
      ? "runner"
      : "in-process";
  }

  /** Whether the chosen placement has the shared reverse host-call handler. */
  supportsHostRpc(): boolean {
    return this.placement() === "runner"
      ? (this.deps.pool?.supportsHostRpc() ?? false)
      : this.deps.hostRpc !== undefined;
  }

  /**
   * Dispatch one delegated call. The order of the decision is fixed:
   *
   * 1. An optional skill review (`purpose: "skill-review"`) is checked first: it runs only in a runner slot
   *    free right now and otherwise skips with SkillReviewSkippedError (runners off included), never queued
   *    and never run in the daemon.
   * 2. An exact protected parent/child match (the host-only HostWorkflowNodeDispatch scope) awaits its
   *    assertion and then runs in the daemon under the same fence, before runner mode: the explicit daemon
   *    placement of automatic missing-child recovery, like stored-child recovery. Only this context selects
   *    it; no request field, RPC or registry does.
   * 3. Everything else (ordinary live calls, a mismatched or missing child, nested descendants) keeps the
   *    configured placement; a runner startup error is thrown as is, never replayed or run locally.
   */
  send(
    request: DelegatedTurnRequest,
    options: { signal?: AbortSignal; onProgress?: (text: string) => void } = {},
  ): Promise<DelegatedTurnResult> {
    const fence = this.deps.fence ?? ((_r, work) => work());
    if (request.purpose === "skill-review") return this.#sendSkillReview(request, options, fence);
    const scope = currentWorkflowNodeDispatch();
    if (matchesProtectedDispatch(scope, request)) {
      return assertProtectedDispatch(scope)
        .then(() => retireRunnerRoute(this.deps.pool, request.sessionId))
        .then(() =>
          fence(request, () => outsideWorkflowNodeDispatch(() => this.#runInProcess(request, options))),
        );
    }
    const placement = this.placement();
    return fence(request, () =>
      placement === "runner" && this.deps.pool
        ? this.deps.pool.runTurn(request, options)
        : this.#runInProcess(request, options),
    );
  }

  async #sendSkillReview(
    request: DelegatedTurnRequest,
    options: { signal?: AbortSignal; onProgress?: (text: string) => void },
    fence: RemoteCallFence,
  ): Promise<DelegatedTurnResult> {
    const pool = this.deps.pool;
    if (this.placement() !== "runner" || !pool) {
      throw new SkillReviewSkippedError("runner_disabled", "skill review skipped: sub-agent runners are off");
    }
    return fence(request, async () => {
      const admitted = pool.tryRunTurn(request, options);
      if ("refused" in admitted) {
        throw new SkillReviewSkippedError(
          `runner_${admitted.refused}`,
          `skill review skipped: runner ${admitted.refused}`,
          { cause: admitted.error },
        );
      }
      return admitted.result;
    });
  }

  /** Abort a parent channel in both placements. */
  abortChannel(channelId: string): void {
    this.deps.pool?.abortChannel(channelId);
    for (const t of this.#localControllers.values()) if (t.channelId === channelId) t.controller.abort();
  }

  /** A read-only view: the routed runner's tap, or the in-daemon child directly. */
  async tap(
    sessionId: string,
    onEvent: (event: TapEvent) => void,
    history: { before?: string; limit?: number } = {},
  ): Promise<{ snapshot: ReturnType<SessionViews["subscribe"]>; close(): Promise<void> }> {
    const remote = await this.deps.pool?.tap(sessionId, onEvent, history);
    if (remote) return remote;
    const tapId = `local-${++this.#tapSeq}`;
    this.#localTaps.set(tapId, onEvent);
    const snapshot = outsideDispatchedTurn(() =>
      this.#localViews.subscribe(
        tapId,
        sessionId,
        {
          limit: history.limit ?? 50,
          ...(history.before && { before: history.before }),
        },
        { includeExecution: false },
      ),
    );
    return {
      snapshot,
      close: async () => {
        this.#localTaps.delete(tapId);
        this.#localViews.unsubscribe(tapId);
      },
    };
  }

  async #runInProcess(
    request: DelegatedTurnRequest,
    options: { signal?: AbortSignal; onProgress?: (text: string) => void },
  ): Promise<DelegatedTurnResult> {
    if (options.signal?.aborted) throw new DelegationAbortedError(request.channelId);
    const controller = new AbortController();
    const onAbort = () => controller.abort();
    options.signal?.addEventListener("abort", onAbort, { once: true });
    this.#localControllers.set(request.turnId, { channelId: request.channelId, controller });
    this.#localViews.beginTurn(request);
    let text: string | undefined;
    try {
      const result = await runInDispatchedTurn(
        { turnId: request.turnId, sessionId: request.sessionId, signal: controller.signal },
        () =>
          this.deps.inProcess.runTurn(request, {
            signal: controller.signal,
            emit: (event) => this.#localViews.event(request.sessionId, event),
            progress: (t) => options.onProgress?.(t),
            hostRpc: (method, params) => this.#localHostRpc(request, method, params, controller.signal),
            // In the daemon a started process is the daemon's own child; no runner death to contain.
            spawn: (command) => this.#localProcesses.start(command),
          }),
      );
      text = result.text;
      return result;
    } catch (e) {
      throw toError(e);
    } finally {
      options.signal?.removeEventListener("abort", onAbort);
      this.#localControllers.delete(request.turnId);
      this.#localViews.endTurn(request.sessionId, text);
    }
  }

  async #localHostRpc(
    request: DelegatedTurnRequest,
    method: Parameters<HostRpcHandler>[0],
    params: unknown,
    signal: AbortSignal,
  ): Promise<unknown> {
    if (currentDispatchedTurn()?.turnId !== request.turnId) {
      throw new HostRpcRefusedError(
        "outside_turn",
        `host call ${method} refused: no dispatched turn owns it`,
      );
    }
    if (!this.deps.hostRpc) throw new HostRpcRefusedError("unsupported", `no daemon handler for ${method}`);
    const checked = hostRpcParamsSchemas[method].safeParse(params);
    if (!checked.success)
      throw new HostRpcRefusedError("invalid_params", `host call ${method}: invalid params`);
    return this.deps.hostRpc(method, checked.data, {
      runnerId: "daemon",
      turnId: request.turnId,
      sessionId: request.sessionId,
      signal,
    });
  }
}
