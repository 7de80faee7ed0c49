/** The typed errors of @crw/db. Match on `code` across processes, never on `instanceof`. */
export type DelegationDbErrorCode =
  | "not_found"
  | "cross_account"
  | "conflict"
  | "malformed_entry"
  | "invalid_input"
  | "stale_generation";

export class DelegationDbError extends Error {
  override readonly name = "DelegationDbError";
  constructor(
    readonly code: DelegationDbErrorCode,
    message: string,
    readonly context: Readonly<Record<string, unknown>> = {},
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
  /** None of these gets better by trying again; transient database failures are retried inside `tx`. */
  get retryable(): boolean {
    return false;
  }
}

export function toError(e: unknown): Error {
  return e instanceof Error ? e : new Error(String(e));
}
