import type { Tokens } from "../journal/rows.js";
import type { RunContext } from "./runContext.js";

/** Ends the call's attempt held for `reason` (with the tokens the call has spent so far, when known). */
export function hold(
  rc: RunContext,
  call: string,
  tokens: Tokens | undefined,
  reason: string,
  detail?: string,
): void {
  rc.append([
    {
      type: "held",
      call,
      op: call,
      reason,
      ...(detail ? { detail } : {}),
      ...(tokens ? { tokens } : {}),
    },
  ]);
  rc.emit({ type: "call_ended", call, status: `held (${reason})` });
}

/**
 * A call held for a cause of its own (a host failure, a deadline, evidence that cannot be placed) pauses
 * the run: its other calls stop, and a resume gives this call a new attempt.
 */
export function pauseForHeldCall(rc: RunContext, call: string): void {
  rc.append([{ type: "run_paused", reason: `held:${call}`, call }]);
  rc.stop(`held:${call}`);
}
