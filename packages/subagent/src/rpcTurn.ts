import { AsyncLocalStorage } from "node:async_hooks";

/**
 * The dispatched-call context inside a runner: which daemon-admitted turn the current async work belongs
 * to. Reverse host calls read it to name their turn; work outside any dispatched turn (a tap, a timer left
 * behind by a finished turn) finds none and is refused by the host RPC client.
 */
export interface DispatchedTurn {
  readonly turnId: string;
  readonly sessionId: string;
  readonly signal: AbortSignal;
}

const storage = new AsyncLocalStorage<DispatchedTurn>();

export function runInDispatchedTurn<T>(turn: DispatchedTurn, work: () => T): T {
  return storage.run(turn, work);
}

export function currentDispatchedTurn(): DispatchedTurn | undefined {
  return storage.getStore();
}

/** Run work with no dispatched-turn authority (a read-only view must not inherit a turn's context). */
export function outsideDispatchedTurn<T>(work: () => T): T {
  return storage.exit(work);
}
