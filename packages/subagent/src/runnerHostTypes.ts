import type { TreeMemory } from "./heartbeat.js";
import type { HostRpcMethod } from "./protocol/hostRpcMethods.js";
import type { LocalExecEvent, LocalExecFinal, LocalExecRequest } from "./protocol/localExec.js";
import type { HeartbeatFrame } from "./protocol/output.js";
import type { ModelCatalogPublication } from "./protocol/policy.js";
import type { AgentOptions, SessionRunnerKind } from "./protocol/sessionTurn.js";
import type { TapSnapshot } from "./protocol/turn.js";
import type { ProviderUsage } from "./providerUsage.js";
import type { RetryPolicySource } from "./retryPolicy.js";

/** Boot deadline of one physical attempt: fork, hello, boot reply. Not a retry budget. */
export const RUNNER_BOOT_TIMEOUT_MS = 60_000;
/** A tap waits this long for the runner's snapshot. */
export const TAP_TIMEOUT_MS = 2_000;
export const MEASURE_FAILED_TEXT = "could not measure runner descendants";

export interface HostRpcRequestContext {
  readonly runnerId: string;
  readonly turnId: string;
  readonly sessionId: string;
  readonly signal: AbortSignal;
}
/** The daemon's handler of reverse host calls; params arrive validated against the method's schema. */
export type HostRpcHandler = (
  method: HostRpcMethod,
  params: unknown,
  context: HostRpcRequestContext,
) => Promise<unknown>;

/** The daemon's local execution (its sandbox); streams partial events through `emit`, settles with the final. */
export type LocalExecHandler = (
  request: LocalExecRequest,
  context: HostRpcRequestContext & { readonly emit: (event: LocalExecEvent) => void },
) => Promise<LocalExecFinal>;

export type RunnerHostEvent =
  | { type: "frame_refused"; runnerId: string; issues: string }
  | { type: "heartbeat"; runnerId: string; heartbeat: HeartbeatFrame; memory: TreeMemory }
  | { type: "measure_failed"; runnerId: string; message: typeof MEASURE_FAILED_TEXT; error: string }
  | { type: "exit"; runnerId: string; code: number | null; signal: NodeJS.Signals | null }
  | { type: "stderr"; runnerId: string; line: string }
  | { type: "steer_settled"; runnerId: string; sessionId: string; count: number }
  | { type: "provider_usage"; runnerId: string; sessionId: string; turnId: string; usage: ProviderUsage };

export interface SubagentRunnerHostDeps {
  readonly runnerId: string;
  /** RUNNER_ENTRY (see runnerEntry.ts). */
  readonly entry: string;
  /** The daemon's build identity, captured once per startup episode. */
  readonly buildId: string;
  readonly retryPolicySource: RetryPolicySource;
  readonly catalog: ModelCatalogPublication;
  readonly bootTimeoutMs?: number;
  readonly heartbeatIntervalMs?: number;
  /** Provider options for the runner's agent loop (see AgentOptions). */
  readonly agentOptions?: AgentOptions;
  readonly env?: NodeJS.ProcessEnv;
  readonly execArgv?: readonly string[];
  /** Node binary to fork with; a missing one is a fork failure. */
  readonly execPath?: string;
  readonly hostRpc?: HostRpcHandler;
  readonly localExec?: LocalExecHandler;
  readonly onEvent?: (event: RunnerHostEvent) => void;
  /** Lifetime check: false once the pool replaced or reset the lifetime this attempt belongs to. */
  readonly isCurrent?: () => boolean;
  readonly procRoot?: string;
}

/** How a session turn is placed: its fairness key, nesting and which SessionTurnRunner the runner uses. */
export interface SessionTurnMeta {
  readonly turnId: string;
  readonly channelId: string;
  readonly parentSessionId?: string;
  readonly runner: SessionRunnerKind;
}

export interface TapHandle {
  readonly snapshot: TapSnapshot;
  close(): Promise<void>;
}

export interface RunnerStats {
  readonly runnerId: string;
  readonly pid: number | undefined;
  readonly state: "ready" | "exited";
  readonly activeTurns: number;
  /** Absent before the first heartbeat. */
  readonly load?: {
    eventLoopP99Ms: number;
    rssBytes: number;
    turns: number;
    sessions: number;
    memory: TreeMemory;
  };
}
