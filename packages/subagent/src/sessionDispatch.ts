import { randomUUID } from "node:crypto";
import type { SessionTurnRunner, TurnHost, TurnOutcome, TurnRequest } from "@crw/brain";
import type { SubagentRunnerPool } from "./pool.js";
import {
  assertProtectedDispatch,
  currentWorkflowNodeDispatch,
  matchesProtectedDispatch,
  outsideWorkflowNodeDispatch,
  retireRunnerRoute,
} from "./protectedPlacement.js";
import type { SessionRunnerKind } from "./protocol/sessionTurn.js";

/**
 * Whether ordinary delegated work would run in a runner: the explicit switch and the runner's optional
 * usable capability (absent pool, or an operator maximum of zero, is not usable).
 */
export function predictsRunnerDispatch(runner: { usable(): boolean } | undefined, enabled: boolean): boolean {
  return enabled && (runner?.usable() ?? false);
}

export type Placement = "runner" | "in-process";

export interface SessionDispatchDeps {
  readonly pool?: SubagentRunnerPool;
  /** The daemon's own SessionTurnRunner: the rollback path when runners are off. */
  readonly inProcess: SessionTurnRunner;
  /** runtime.subagentRunnerEnabled, read per turn; default true. */
  readonly runnerEnabled?: () => boolean;
  /** Which SessionTurnRunner runners use; default the agent loop. */
  readonly runnerKind?: SessionRunnerKind;
  /**
   * Where a turn belongs: its parent's channel (the fairness key and unit of abort) and its parent session
   * (a nested edge when that parent is routed to the same runner). The daemon reads it from the session row;
   * by default a turn is its own channel with no parent.
   */
  readonly placementOf?: (
    request: TurnRequest,
  ) =>
    | Promise<{ channelId: string; parentSessionId?: string }>
    | { channelId: string; parentSessionId?: string };
  /** Observes every placement decision (runner or in-process), for health and tests. */
  readonly onPlaced?: (request: TurnRequest, placement: Placement) => void;
}

/**
 * brain's SessionTurnRunner seam, implemented by dispatch: a delegated child's turn (one with a durable scope;
 * root sessions stay in the daemon) runs in a forked runner by default
 * and in the daemon when the operator turns runners off, decided per turn in one place. Nothing in the
 * delegation core changes: it hands this runner a TurnRequest and its TurnHost as it would the in-process one.
 * A failed turn is never replayed; a runner startup failure is thrown as a typed RunnerStartupError and
 * never falls back to the daemon.
 */
export class SubagentSessionDispatch implements SessionTurnRunner {
  constructor(private readonly deps: SessionDispatchDeps) {}

  placement(): Placement {
    return predictsRunnerDispatch(this.deps.pool, this.deps.runnerEnabled?.() ?? true)
      ? "runner"
      : "in-process";
  }

  /**
   * Root sessions stay in the daemon. An exact protected parent/child match (HostWorkflowNodeDispatch, see
   * protectedPlacement.ts) is asserted and runs in the daemon before runner mode; with no protected scope
   * there is no assertion work and no extra read. Everything else keeps the configured placement.
   */
  async runTurn(request: TurnRequest, host: TurnHost): Promise<TurnOutcome> {
    const scope = currentWorkflowNodeDispatch();
    let where: { channelId: string; parentSessionId?: string } | undefined;
    let protectedMatch = false;
    if (request.scope !== null && scope?.childSessionId === request.sessionId) {
      where = await this.#where(request);
      protectedMatch = matchesProtectedDispatch(scope, { sessionId: request.sessionId, ...where });
      if (protectedMatch && scope) {
        await assertProtectedDispatch({ ...scope, childSessionId: request.sessionId });
        await retireRunnerRoute(this.deps.pool, request.sessionId);
      }
    }
    // Runners are for delegated children: a root session (with or without a scope of its own) runs in the daemon.
    const root = request.scope === null || request.rootSession === true;
    const placement = root || protectedMatch ? "in-process" : this.placement();
    this.deps.onPlaced?.(request, placement);
    const pool = this.deps.pool;
    if (protectedMatch) return outsideWorkflowNodeDispatch(() => this.deps.inProcess.runTurn(request, host));
    if (placement === "in-process" || !pool) return this.deps.inProcess.runTurn(request, host);
    where ??= await this.#where(request);
    return pool.runSessionTurn(request, host, {
      turnId: randomUUID(),
      channelId: where.channelId,
      ...(where.parentSessionId !== undefined && { parentSessionId: where.parentSessionId }),
      runner: this.deps.runnerKind ?? "agent",
    });
  }

  async #where(request: TurnRequest): Promise<{ channelId: string; parentSessionId?: string }> {
    return (await this.deps.placementOf?.(request)) ?? { channelId: request.sessionId };
  }
}
