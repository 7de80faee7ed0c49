/** The typed errors of delegation. Across processes, match on `code`, never on `instanceof`. */
export type DelegationErrorCode =
  /** The child is busy in a way this caller must wait out (a planning caller, or a read-only call). */
  | "wait_required"
  /** write access asked for from a read-only turn. */
  | "write_access_refused"
  /** A tool call outside the scope's allow-list, or inside its deny-list. */
  | "tool_not_allowed"
  | "invalid_input"
  | "not_found"
  /** The full result could not be written to the spill store. */
  | "spill_failed"
  | "child_failed"
  | "aborted"
  /** The process is pausing for a restart (pauseForRestart): no new delegation or turn work is admitted. */
  | "paused_for_restart";

export class DelegationError extends Error {
  override readonly name = "DelegationError";
  constructor(
    readonly code: DelegationErrorCode,
    message: string,
    readonly context: Readonly<Record<string, unknown>> = {},
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
  /** Waiting is the one condition a later identical request can clear. */
  get retryable(): boolean {
    return this.code === "wait_required";
  }
}

export function toError(e: unknown): Error {
  return e instanceof Error ? e : new Error(String(e));
}

/** Which asynchronous host contract a settlement awaited. */
export type HostContract = "tool_result_inline_bytes" | "output_writer" | "completion_emitter";

/**
 * A host contract (the inline-byte limit, the recipient's output-writer capture, the completion emitter)
 * rejected while a result was being prepared. Nothing was settled: the call stays open with its journal
 * intact, and boot recovery settles it later (exactly once).
 */
export class HostContractError extends Error {
  override readonly name = "HostContractError";
  readonly code = "host_contract_failed";
  constructor(
    readonly contract: HostContract,
    cause: unknown,
  ) {
    super(`the host's ${contract} contract failed: ${toError(cause).message}`, { cause });
  }
}

/** Awaits one asynchronous host contract; a rejection (or a throw) becomes a HostContractError. */
export async function hostContract<T>(contract: HostContract, call: () => T | Promise<T>): Promise<T> {
  try {
    return await call();
  } catch (e) {
    throw new HostContractError(contract, e);
  }
}
