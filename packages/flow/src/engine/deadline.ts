import type { RowOf } from "../journal/rows.js";

/** The hold reason of a call whose attempt ran past the call's deadline. */
export const DEADLINE = "deadline";

/**
 * When the call's attempt passes its deadline (`deadline_ms` of its input, counted from `begun`, the
 * attempt's first row: its first step on the session backend, its thread on the app-server backend), or
 * null when the call has no deadline or the attempt has not begun. Read from the rows, so a resumed
 * process keeps the dead one's clock, and a new attempt after a hold gets a whole deadline again.
 */
export function attemptDeadline(
  prepared: RowOf<"prepared"> | null | undefined,
  begun: { at: string } | undefined,
): number | null {
  const ms = prepared?.input.deadline_ms;
  return ms && begun ? Date.parse(begun.at) + ms : null;
}

export function pastDeadline(at: number | null, now = Date.now()): boolean {
  return at !== null && now >= at;
}
