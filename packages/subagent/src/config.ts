import type { SessionTurnRunner } from "@crw/brain";
import { z } from "zod";
import { HEARTBEAT_INTERVAL_MS } from "./heartbeat.js";
import { SubagentRunnerPool } from "./pool.js";
import type { PoolEvent } from "./poolTypes.js";
import type { ModelCatalogPublication } from "./protocol/policy.js";
import { type AgentOptions, sessionRunnerKindSchema } from "./protocol/sessionTurn.js";
import type { RetryPolicySource } from "./retryPolicy.js";
import type { HostRpcHandler, LocalExecHandler } from "./runnerHost.js";
import { RUNNER_BOOT_TIMEOUT_MS } from "./runnerHost.js";
import { type SessionDispatchDeps, SubagentSessionDispatch } from "./sessionDispatch.js";

/**
 * The operator's runtime settings for sub-agent execution, parsed once at the edge. `subagentRunnerEnabled`
 * is true by default; false rolls ordinary delegated execution back to the daemon, read per turn so a change
 * applies without a redeploy. `maxRunners: 0` also selects the daemon; a memory budget that leaves no runner
 * keeps runner mode and refuses admission.
 */
export const subagentConfigSchema = z
  .object({
    subagentRunnerEnabled: z.boolean().default(true),
    maxRunners: z.number().int().min(0).max(256).default(2),
    turnsPerRunner: z.number().int().min(1).max(1024).default(4),
    memoryBudgetBytes: z.number().int().min(0).optional(),
    runnerMemoryBytes: z.number().int().min(1).optional(),
    bootTimeoutMs: z.number().int().min(100).max(RUNNER_BOOT_TIMEOUT_MS).default(RUNNER_BOOT_TIMEOUT_MS),
    heartbeatIntervalMs: z.number().int().min(10).max(600_000).default(HEARTBEAT_INTERVAL_MS),
    runnerKind: sessionRunnerKindSchema.default("agent"),
  })
  .strict();
export type SubagentConfig = z.infer<typeof subagentConfigSchema>;

export function parseSubagentConfig(raw: unknown): SubagentConfig {
  return subagentConfigSchema.parse(raw ?? {});
}

export interface SubagentRuntimeDeps {
  /** The current settings (re-read per decision). */
  readonly config: () => SubagentConfig;
  /** The daemon's one required policy source, late-bound (see LateBoundRetryPolicySource). */
  readonly retryPolicySource: () => RetryPolicySource;
  /** The daemon's own SessionTurnRunner (the agent loop in process). */
  readonly inProcess: SessionTurnRunner;
  readonly catalog?: () => ModelCatalogPublication;
  /** The provider options the daemon's own agent loop uses; runners get the same at boot. */
  readonly agentOptions?: () => AgentOptions;
  readonly hostRpc?: HostRpcHandler;
  readonly localExec?: LocalExecHandler;
  readonly placementOf?: SessionDispatchDeps["placementOf"];
  /** Observes every placement decision (runner or in-process). */
  readonly onPlaced?: SessionDispatchDeps["onPlaced"];
  readonly onEvent?: (event: PoolEvent) => void;
}

/** The pool and the dispatch as the daemon wires them: the dispatch is the delegation core's SessionTurnRunner. */
export function createSubagentRuntime(deps: SubagentRuntimeDeps): {
  pool: SubagentRunnerPool;
  dispatch: SubagentSessionDispatch;
} {
  const initial = deps.config();
  const pool = new SubagentRunnerPool({
    sizing: () => {
      const c = deps.config();
      return {
        maxRunners: c.maxRunners,
        turnsPerRunner: c.turnsPerRunner,
        ...(c.memoryBudgetBytes !== undefined && { memoryBudgetBytes: c.memoryBudgetBytes }),
        ...(c.runnerMemoryBytes !== undefined && { runnerMemoryBytes: c.runnerMemoryBytes }),
      };
    },
    enabled: () => deps.config().subagentRunnerEnabled,
    retryPolicySource: deps.retryPolicySource,
    catalog: deps.catalog ?? (() => ({ revision: 0, public: [], accounts: {} })),
    bootTimeoutMs: initial.bootTimeoutMs,
    heartbeatIntervalMs: initial.heartbeatIntervalMs,
    ...(deps.hostRpc && { hostRpc: deps.hostRpc }),
    ...(deps.localExec && { localExec: deps.localExec }),
    ...(deps.agentOptions && { agentOptions: deps.agentOptions }),
    ...(deps.onEvent && { onEvent: deps.onEvent }),
  });
  const dispatch = new SubagentSessionDispatch({
    pool,
    inProcess: deps.inProcess,
    runnerEnabled: () => deps.config().subagentRunnerEnabled,
    runnerKind: initial.runnerKind,
    ...(deps.placementOf && { placementOf: deps.placementOf }),
    ...(deps.onPlaced && { onPlaced: deps.onPlaced }),
  });
  return { pool, dispatch };
}
