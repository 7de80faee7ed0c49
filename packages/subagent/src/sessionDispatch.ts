import { randomUUID } from "node:crypto";
import type { SessionTurnRunner, TurnHost, TurnOutcome, TurnRequest } from "@crw/brain";
import { type Placement, predictsRunnerDispatch } from "./dispatch.js";
import type { SubagentRunnerPool } from "./pool.js";
import type { SessionRunnerKind } from "./protocol/sessionTurn.js";

export interface SessionDispatchDeps {
  readonly pool?: SubagentRunnerPool;
  /** The daemon's own SessionTurnRunner: the rollback path when runners are off. */
  readonly inProcess: SessionTurnRunner;
  /** runtime.subagentRunnerEnabled, read per turn; default true. */
  readonly runnerEnabled?: () => boolean;
  /** The remote-call fence, held around either mode including the queue wait. */
  readonly fence?: <T>(request: TurnRequest, work: () => Promise<T>) => Promise<T>;
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

  runTurn(request: TurnRequest, host: TurnHost): Promise<TurnOutcome> {
    // Runners are for delegated children: a root session (no durable scope) always runs in the daemon.
    const placement = request.scope === null ? "in-process" : this.placement();
    this.deps.onPlaced?.(request, placement);
    const fence = this.deps.fence ?? ((_r, work) => work());
    const pool = this.deps.pool;
    return fence(request, async () => {
      if (placement === "in-process" || !pool) return this.deps.inProcess.runTurn(request, host);
      const where = (await this.deps.placementOf?.(request)) ?? { channelId: request.sessionId };
      return pool.runSessionTurn(request, host, {
        turnId: randomUUID(),
        channelId: where.channelId,
        ...(where.parentSessionId !== undefined && { parentSessionId: where.parentSessionId }),
        runner: this.deps.runnerKind ?? "agent",
      });
    });
  }
}
