import type { Clock } from "./clock.js";
import type { RunnerStartupCategory } from "./errors.js";
import type { ModelCatalogPublication } from "./protocol/policy.js";
import type { AgentOptions } from "./protocol/sessionTurn.js";
import type { ProviderUsage } from "./providerUsage.js";
import type { RetryPolicySource } from "./retryPolicy.js";
import type { HostRpcHandler, LocalExecHandler } from "./runnerHost.js";

/** One captured sizing snapshot; every decision and statistic of one check reads the same snapshot. */
export interface RunnerPoolSizing {
  /** Operator maximum of runners. Zero selects daemon-local execution (see dispatch). */
  readonly maxRunners: number;
  /** Concurrent turns one runner serves, nested child turns included. */
  readonly turnsPerRunner: number;
  /** With both set, runners are also bounded by memory; a memory-derived zero stays runner mode and refuses. */
  readonly memoryBudgetBytes?: number;
  readonly runnerMemoryBytes?: number;
}

/**
 * What the daemon supplies. Host callbacks (heartbeat, exit, steer/result/usage/process sinks) are not here:
 * the pool owns its hosts' callbacks and daemon consumers attach sinks instead (attach*Sink).
 */
export interface SubagentRunnerPoolDeps {
  readonly sizing: () => RunnerPoolSizing;
  /** runtime.subagentRunnerEnabled; absent means enabled. */
  readonly enabled?: () => boolean;
  /** Late-bound: the daemon's one required source, read only when an episode starts. */
  readonly retryPolicySource: () => RetryPolicySource;
  readonly catalog: () => ModelCatalogPublication;
  readonly entry?: string;
  /** Build identity; default: the digest of `entry`, captured once per startup episode. */
  readonly buildId?: string;
  readonly clock?: Clock;
  readonly bootTimeoutMs?: number;
  readonly heartbeatIntervalMs?: number;
  /** Provider options for runners' agent loops: pass what the daemon's own agent loop gets. */
  readonly agentOptions?: () => AgentOptions;
  readonly env?: NodeJS.ProcessEnv;
  readonly execArgv?: readonly string[];
  readonly execPath?: string;
  readonly procRoot?: string;
  /** The shared reverse host-call handler; absent means runners cannot call back (supportsHostRpc false). */
  readonly hostRpc?: HostRpcHandler;
  /**
   * The daemon's local execution (its sandbox reaching paired computers), for Bash/Files/Terminal in
   * runners; absent means local execution requests are refused as unsupported.
   */
  readonly localExec?: LocalExecHandler;
  readonly onEvent?: (event: PoolEvent) => void;
}

/** Progress of the pool's one serialized startup episode. */
export interface RetryProgress {
  /** 0 is the original attempt; retries count from 1 up to maxRetries. */
  readonly attempt: number;
  readonly maxRetries: number;
  readonly state: "starting" | "waiting";
  readonly nextDelayMs: number | null;
}

export interface SpawnFailure {
  readonly category: RunnerStartupCategory | "cancelled";
  readonly state: "retrying" | "exhausted" | "latched" | "cancelled";
}

/** /health: typed categories and counts only, no diagnostic prose, paths, pids or build ids. */
export interface PoolHealth {
  readonly mode: "runner" | "in-process";
  readonly operatorDisabled: boolean;
  readonly maxRunners: number;
  readonly effectiveRunners: number;
  readonly queued: number;
  readonly turns: number;
  readonly sessions: number;
  readonly nestedTurns: number;
  readonly runners: readonly {
    readonly runnerId: string;
    readonly turns: number;
    readonly sessions: number;
    readonly nestedTurns: number;
    readonly eventLoopP99Ms: number | null;
    readonly memoryBytes: number | null;
    readonly memoryComplete: boolean | null;
  }[];
  readonly startupRetry: RetryProgress | null;
  readonly spawnFailure: SpawnFailure | null;
  readonly restartRequired: boolean;
}

export type PoolEvent =
  | { type: "runner_ready"; runnerId: string }
  | { type: "runner_exited"; runnerId: string; code: number | null; signal: string | null }
  | { type: "startup_failed"; attempt: number; category: RunnerStartupCategory }
  | { type: "turn_queued"; turnId: string; channelId: string }
  | { type: "turn_dispatched"; turnId: string; runnerId: string; nested: boolean }
  | { type: "frame_refused"; runnerId: string; issues: string }
  | { type: "measure_failed"; runnerId: string; message: string }
  | { type: "runner_log"; runnerId: string; line: string }
  | { type: "alert_failed"; error: string }
  | { type: "sink_failed"; sink: "steerSettled" | "processChanged" | "providerUsage"; error: string };

export type ResultDeliveredSink = (delivery: {
  parentSessionId: string;
  results: { resultId: string; toolCallId: string; kind: "result" | "workflow" }[];
}) => Promise<void>;
export type RunnerExitTokensSink = (exit: { runnerId: string; killTokens: readonly string[] }) => void;

/** A runner turn consumed steering the daemon's seam handed it (drainSteering answered with messages). */
export type SteerSettledSink = (settled: { runnerId: string; sessionId: string; count: number }) => void;

/**
 * The pool's runner processes changed: one started (application-ready) or exited. Typed facts only: no pid,
 * path or build identity reaches a consumer.
 */
export type ProcessChangedSink = (
  change:
    | { runnerId: string; state: "started" }
    | { runnerId: string; state: "exited"; code: number | null; signal: string | null },
) => void;

/** One provider response's usage in a runner's session turn (see providerUsage.ts). */
export type ProviderUsageSink = (report: {
  runnerId: string;
  sessionId: string;
  turnId: string;
  usage: ProviderUsage;
}) => void;
