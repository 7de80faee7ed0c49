/**
 * Errors of the flow-bound path. Across processes match on `code`, never on `instanceof`.
 *
 *   line_invalid   a line of a flow-bound file that is not an orchestrator or closed line (Line.Validate)
 *   file_corrupt   a bad line before the last one (a torn last line is ignored, never an error)
 *   untrusted      the flow-bound directory or file is a link, not the user's, or writable by others
 *   unwritable     the binding could not be written (the run starts all the same, with a warning)
 *   lock_timeout   the flow-bound directory lock was not free in time
 */
export type BoundErrorCode = "line_invalid" | "file_corrupt" | "untrusted" | "unwritable" | "lock_timeout";

export class BoundError extends Error {
  override readonly name = "BoundError";
  readonly retryable: boolean;
  constructor(
    readonly code: BoundErrorCode,
    message: string,
    readonly context: Readonly<Record<string, unknown>> = {},
  ) {
    super(message);
    this.retryable = code === "lock_timeout";
  }
}

export function asError(e: unknown): Error {
  return e instanceof Error ? e : new Error(String(e));
}
