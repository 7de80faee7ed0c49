/**
 * The adapter's errors. They never leave `SessionHost` as exceptions: every method answers `HostResult`
 * data. They exist for the transport and RPC layers, whose callers match on `name`/`code`.
 */

/** The host could not be asked: the transport failed to connect, died, or a request ran out of time. */
export class HostUnreachableError extends Error {
  override readonly name = "HostUnreachableError";
  readonly retryable = true;
  constructor(
    readonly code: "connect_failed" | "closed" | "timeout",
    message: string,
    readonly method?: string,
  ) {
    super(message);
  }
}

/** The host answered a request with a JSON-RPC error object. */
export class HostRpcError extends Error {
  override readonly name = "HostRpcError";
  readonly retryable = false;
  constructor(
    readonly method: string,
    readonly rpcCode: number,
    message: string,
  ) {
    super(message);
  }
}

/** The host sent something that is not the protocol (a bad frame, a result of the wrong shape). */
export class HostProtocolError extends Error {
  override readonly name = "HostProtocolError";
  readonly retryable = false;
  constructor(
    message: string,
    readonly method?: string,
  ) {
    super(message);
  }
}

export function toError(e: unknown): Error {
  return e instanceof Error ? e : new Error(String(e));
}
