/**
 * The named errors of the runner boundary. Each carries a stable `code` and states whether a caller may
 * retry. Across the process boundary only `name`, `code` and `message` travel (see protocol/envelope.ts);
 * receivers rebuild the class from `name`, never from message text.
 */

export type SubagentErrorCode =
  | "runner_startup"
  | "runner_exited"
  | "runner_unavailable"
  | "delegation_aborted"
  | "tap_timeout"
  | "host_rpc_closed"
  | "host_rpc_refused"
  | "host_rpc_timeout"
  | "retry_policy_unavailable"
  | "protocol_violation"
  | "turn_failed"
  | "skill_review_skipped"
  | "session_closed"
  | "session_busy";

export abstract class SubagentError extends Error {
  abstract readonly code: SubagentErrorCode;
  abstract readonly retryable: boolean;
}

/** Why a single fork/handshake attempt did not reach application-ready. */
export type RunnerStartupCategory = "fork_failed" | "boot_timeout" | "build_mismatch" | "boot_failed";

export class RunnerStartupError extends SubagentError {
  override readonly name = "RunnerStartupError";
  readonly code = "runner_startup" as const;
  /** A build mismatch or an exhausted episode never heals in this process; the rest may on a new episode. */
  readonly retryable: boolean;
  constructor(
    readonly category: RunnerStartupCategory,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.retryable = category !== "build_mismatch";
  }
}

/** The runner process exited (or its channel closed) while a request was pending. */
export class RunnerExitedError extends SubagentError {
  override readonly name = "RunnerExitedError";
  readonly code = "runner_exited" as const;
  /** The outcome of the pending work is unknown: it is never replayed automatically. */
  readonly retryable = false;
  constructor(
    readonly runnerId: string,
    readonly exit: { code: number | null; signal: NodeJS.Signals | null },
  ) {
    super(
      `sub-agent runner ${runnerId} exited (code ${exit.code ?? "none"}, signal ${exit.signal ?? "none"}) before answering`,
    );
  }
}

/** The pool cannot admit work: disabled mode, a memory-derived zero capacity, a terminal startup episode. */
export class RunnerUnavailableError extends SubagentError {
  override readonly name = "RunnerUnavailableError";
  readonly code = "runner_unavailable" as const;
  readonly retryable = false;
  constructor(
    readonly reason: "no_capacity" | "startup_terminal" | "build_mismatch" | "closed",
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** A queued or running delegated turn whose channel was aborted. Queued turns rejected with it never ran. */
export class DelegationAbortedError extends SubagentError {
  override readonly name = "DelegationAbortedError";
  readonly code = "delegation_aborted" as const;
  readonly retryable = false;
  constructor(
    readonly channelId: string,
    message = `delegation on channel ${channelId} was aborted`,
  ) {
    super(message);
  }
}

export const TAP_TIMEOUT_TEXT = "sub-agent runner tap timed out";

export class TapTimeoutError extends SubagentError {
  override readonly name = "TapTimeoutError";
  readonly code = "tap_timeout" as const;
  readonly retryable = true;
  constructor() {
    super(TAP_TIMEOUT_TEXT);
  }
}

/** A remote turn failed inside the runner; name and code come from the runner's error envelope. */
export class RemoteTurnError extends SubagentError {
  override readonly name = "RemoteTurnError";
  readonly code = "turn_failed" as const;
  readonly retryable = false;
  constructor(readonly remote: { name: string; code: string; message: string }) {
    super(remote.message);
  }
}

/** Coerce anything thrown into an Error, the first step of every catch. */
export function toError(e: unknown): Error {
  if (e instanceof Error) return e;
  return new Error(typeof e === "string" ? e : JSON.stringify(e));
}

/** A startup attempt whose lifetime was replaced or reset before it finished; its result is discarded. */
export class RunnerStartupCancelledError extends SubagentError {
  override readonly name = "RunnerStartupCancelledError";
  readonly code = "runner_startup" as const;
  readonly retryable = false;
}

/** The event name a local execution stream reports when its transport is lost. */
export const SESSION_CLOSED = "session.closed";

/**
 * Transport loss of a local execution stream (`session.closed`): the runner or the daemon channel went away
 * while the call (a retained service included) was open. The daemon's handler sees it as its signal's
 * reason; the runner's registry sees it as the call's final error. Nothing is replayed.
 */
export class LocalExecSessionClosedError extends SubagentError {
  override readonly name = "LocalExecSessionClosedError";
  readonly code = "session_closed" as const;
  readonly event = SESSION_CLOSED;
  readonly retryable = false;
  constructor(message = `${SESSION_CLOSED}: the runner's channel to the daemon closed`) {
    super(message);
  }
}
