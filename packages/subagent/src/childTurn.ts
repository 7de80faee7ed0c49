import type { LocalExecCall } from "./localExecClient.js";
import type { HostRpcMethod } from "./protocol/hostRpcMethods.js";
import type { LocalExecEvent, LocalExecRequest } from "./protocol/localExec.js";
import type { DelegatedTurnRequest, DelegatedTurnResult, TapEvent } from "./protocol/turn.js";

/**
 * What runs one delegated child turn, wherever it runs. The same contract serves the daemon's in-process
 * path and the executor inside a runner, so placement changes where a turn runs, never what it does.
 *
 * - `signal` aborts the turn (Stop, channel abort, shutdown); an aborted turn resolves with
 *   `stopReason: "aborted"` or rejects, and is never replayed.
 * - `emit` carries full text/reasoning/tool events; they only leave the process while a view is tapped.
 * - `progress` is the parent's narrow, low-frequency stream.
 * - `hostRpc` makes a reverse call to the daemon under this turn.
 * - `spawn` starts a process that may outlive the turn.
 */
export interface ChildTurnContext {
  readonly signal: AbortSignal;
  emit(event: TapEvent): void;
  progress(text: string): void;
  hostRpc(method: HostRpcMethod, params: unknown): Promise<unknown>;
  /** Start a process for this turn; resolves with its pid. In a runner it is contained (see containment.ts). */
  spawn(command: readonly string[]): Promise<number>;
  /** Local execution through the daemon (runners only); absent in the daemon itself. */
  localExec?(request: LocalExecRequest, onEvent?: (event: LocalExecEvent) => void): LocalExecCall;
  /** Cancel the background services this runner's registry admitted. */
  stopServices?(): number;
}

export interface ChildTurnExecutor {
  runTurn(request: DelegatedTurnRequest, context: ChildTurnContext): Promise<DelegatedTurnResult>;
}
