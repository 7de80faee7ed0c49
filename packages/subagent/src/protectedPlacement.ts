import { AsyncLocalStorage } from "node:async_hooks";
import { SubagentError } from "./errors.js";

/**
 * A host-only proof that the current async work is the daemon's own automatic continuation of one exact
 * stored child (a workflow node whose child session was missing its turn, recovered in the daemon like
 * stored-child recovery). It lives only in this context: it is never a field of a request, an IPC frame or
 * a host RPC, so nothing a runner or a model sends can claim it.
 *
 * `parentSessionId` and `channelId` name the native reference's parent and its channel; `childSessionId` the
 * exact child. An absent child is not a wildcard: such a scope matches nothing. `assertDispatch` is the
 * delegated-session owner's assertion, awaited once per matched call before the turn runs.
 */
export interface HostWorkflowNodeDispatch {
  readonly parentSessionId: string;
  readonly channelId: string;
  readonly childSessionId?: string;
  readonly assertDispatch?: (childSessionId: string) => Promise<void>;
}

/** The protected scope matched a call but carries no assertion: refused loudly, never run unasserted. */
export class ProtectedDispatchError extends SubagentError {
  override readonly name = "ProtectedDispatchError";
  readonly code = "protocol_violation" as const;
  readonly retryable = false;
}

/**
 * The matched child still runs a turn in the runner it is routed to: it is not continued in the daemon at the
 * same time. Nothing ran; the route stays.
 */
export class ProtectedDispatchBusyError extends SubagentError {
  override readonly name = "ProtectedDispatchBusyError";
  readonly code = "session_busy" as const;
  readonly retryable = true;
}

/**
 * Before a protected child runs in the daemon, its runner route (from an earlier turn there) is retired, so
 * routing stays exact: "released" drops it, "busy" refuses the continuation (ProtectedDispatchBusyError),
 * "failed" (the runner could not answer) keeps the route as the pool reports it and the continuation goes on.
 */
export async function retireRunnerRoute(
  pool:
    | { routeOf(sessionId: string): string | undefined; release(sessionId: string): Promise<string> }
    | undefined,
  sessionId: string,
): Promise<void> {
  if (!pool?.routeOf(sessionId)) return;
  const state = await pool.release(sessionId);
  if (state === "busy")
    throw new ProtectedDispatchBusyError(
      `child ${sessionId} is still running a turn in its runner; it is not continued in the daemon meanwhile`,
    );
}

const storage = new AsyncLocalStorage<HostWorkflowNodeDispatch>();

export function runWithWorkflowNodeDispatch<T>(dispatch: HostWorkflowNodeDispatch, work: () => T): T {
  return storage.run(Object.freeze({ ...dispatch }), work);
}

export function currentWorkflowNodeDispatch(): HostWorkflowNodeDispatch | undefined {
  return storage.getStore();
}

/** Run work outside any protected scope: a matched child's own turn does not pass the proof to descendants. */
export function outsideWorkflowNodeDispatch<T>(work: () => T): T {
  return storage.exit(work);
}

/**
 * Whether a call is the exact protected parent/child: same child, same channel, same parent (a direct
 * child of a root channel has that channel as its parent). Everything else, nested descendants included,
 * keeps its configured placement.
 */
export function matchesProtectedDispatch(
  scope: HostWorkflowNodeDispatch | undefined,
  call: { sessionId: string; channelId: string; parentSessionId?: string | undefined },
): scope is HostWorkflowNodeDispatch & { childSessionId: string } {
  if (!scope || scope.childSessionId === undefined) return false;
  return (
    scope.childSessionId === call.sessionId &&
    scope.channelId === call.channelId &&
    scope.parentSessionId === (call.parentSessionId ?? call.channelId)
  );
}

/** The matched call's assertion, before any turn work; a scope without one fails loudly. */
export async function assertProtectedDispatch(
  scope: HostWorkflowNodeDispatch & { childSessionId: string },
): Promise<void> {
  if (!scope.assertDispatch) {
    throw new ProtectedDispatchError(
      `protected dispatch of child ${scope.childSessionId} has no assertion callback`,
    );
  }
  await scope.assertDispatch(scope.childSessionId);
}
