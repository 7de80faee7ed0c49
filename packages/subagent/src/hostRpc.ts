import { randomUUID } from "node:crypto";
import { SubagentError, toError } from "./errors.js";
import type { RemoteError } from "./protocol/envelope.js";
import { type HostRpcMethod, type HostRpcParams, hostRpcParamsSchemas } from "./protocol/hostRpcMethods.js";
import { currentDispatchedTurn } from "./rpcTurn.js";

/** The fixed text every call pending when the daemon channel closes is rejected with. */
export const HOST_RPC_CLOSED_TEXT = "daemon channel closed before the host call settled";
/** Appended for desktop commands: the command may or may not have run, so nobody may repeat it blindly. */
export const DESKTOP_UNKNOWN_OUTCOME_SUFFIX = "; the desktop command's outcome is unknown, do not replay it";

/** Default bound of one reverse call: long enough for a plugin change, short of forever. */
export const HOST_RPC_DEFAULT_TIMEOUT_MS = 120_000;

export class HostRpcClosedError extends SubagentError {
  override readonly name = "HostRpcClosedError";
  readonly code = "host_rpc_closed" as const;
  readonly retryable = false;
}

export class HostRpcRefusedError extends SubagentError {
  override readonly name = "HostRpcRefusedError";
  readonly code = "host_rpc_refused" as const;
  readonly retryable = false;
  constructor(
    readonly reason: string,
    message: string,
  ) {
    super(message);
  }
}

export class HostRpcTimeoutError extends SubagentError {
  override readonly name = "HostRpcTimeoutError";
  readonly code = "host_rpc_timeout" as const;
  readonly retryable = false;
}

/** The daemon answered a host call with an error envelope; name and code are the daemon's. */
export class HostRpcRemoteError extends Error {
  override readonly name: string;
  readonly code: string;
  readonly retryable = false;
  constructor(remote: RemoteError) {
    super(remote.message);
    this.name = remote.name;
    this.code = remote.code;
  }
}

export interface HostRpcTransport {
  /** Post a frame to the daemon; false when the channel is already gone. */
  send(frame: {
    type: "hostRpc";
    requestId: string;
    turnId: string;
    method: HostRpcMethod;
    params: unknown;
  }): boolean;
  cancel(frame: { type: "hostRpcCancel"; requestId: string; rpcId: string }): boolean;
}

interface Pending {
  method: HostRpcMethod;
  resolve: (value: unknown) => void;
  reject: (error: Error) => void;
  cleanup: () => void;
}

/**
 * Runner side of the reverse host calls: bounded requests to the daemon, made only under a dispatched turn,
 * cancelled with the turn's signal or the caller's. Every call ends: answered, timed out, cancelled or
 * rejected by close().
 */
export class HostRpcClient {
  readonly #pending = new Map<string, Pending>();
  #closed = false;

  constructor(
    private readonly transport: HostRpcTransport,
    private readonly defaultTimeoutMs = HOST_RPC_DEFAULT_TIMEOUT_MS,
  ) {}

  get pendingCount(): number {
    return this.#pending.size;
  }

  call<M extends HostRpcMethod>(
    method: M,
    params: HostRpcParams<M>,
    options: { signal?: AbortSignal; timeoutMs?: number } = {},
  ): Promise<unknown> {
    const turn = currentDispatchedTurn();
    if (!turn) {
      return Promise.reject(
        new HostRpcRefusedError("outside_turn", `host call ${method} refused: no dispatched turn owns it`),
      );
    }
    if (this.#closed) return Promise.reject(new HostRpcClosedError(closedText(method)));
    const checked = hostRpcParamsSchemas[method].safeParse(params);
    if (!checked.success) {
      return Promise.reject(new HostRpcRefusedError("invalid_params", `host call ${method}: invalid params`));
    }
    const requestId = randomUUID();
    return new Promise<unknown>((resolve, reject) => {
      const signals = [turn.signal, options.signal].filter((s): s is AbortSignal => s !== undefined);
      const onAbort = () => {
        this.transport.cancel({ type: "hostRpcCancel", requestId: randomUUID(), rpcId: requestId });
        this.#settle(requestId, new DOMException(`host call ${method} cancelled`, "AbortError"));
      };
      // delegation.resultDelivered has no idle deadline: it answers after publication, and only the
      // channel's loss (close) or the turn's abort ends it early.
      const timeoutMs =
        options.timeoutMs ?? (method === "delegation.resultDelivered" ? undefined : this.defaultTimeoutMs);
      const timer =
        timeoutMs === undefined
          ? undefined
          : setTimeout(() => {
              this.transport.cancel({ type: "hostRpcCancel", requestId: randomUUID(), rpcId: requestId });
              this.#settle(requestId, new HostRpcTimeoutError(`host call ${method} timed out`));
            }, timeoutMs);
      const cleanup = () => {
        clearTimeout(timer);
        for (const s of signals) s.removeEventListener("abort", onAbort);
      };
      this.#pending.set(requestId, { method, resolve, reject, cleanup });
      for (const s of signals) {
        if (s.aborted) return onAbort();
        s.addEventListener("abort", onAbort, { once: true });
      }
      if (
        !this.transport.send({
          type: "hostRpc",
          requestId,
          turnId: turn.turnId,
          method,
          params: checked.data,
        })
      ) {
        this.#settle(requestId, new HostRpcClosedError(closedText(method)));
      }
    });
  }

  /** Deliver the daemon's answer; unknown ids (already settled, cancelled) are ignored. */
  settle(requestId: string, result: { ok: unknown } | { error: RemoteError }): boolean {
    if (!this.#pending.has(requestId)) return false;
    if ("error" in result) this.#settle(requestId, new HostRpcRemoteError(result.error));
    else this.#settle(requestId, undefined, result.ok);
    return true;
  }

  /** Reject every pending call with the fixed close text; removes their timers and abort listeners. */
  close(): void {
    this.#closed = true;
    for (const [id, p] of [...this.#pending]) this.#settle(id, new HostRpcClosedError(closedText(p.method)));
  }

  #settle(requestId: string, error: Error | undefined, value?: unknown): void {
    const p = this.#pending.get(requestId);
    if (!p) return;
    this.#pending.delete(requestId);
    p.cleanup();
    if (error) p.reject(toError(error));
    else p.resolve(value);
  }
}

function closedText(method: HostRpcMethod): string {
  return method === "desktop.command"
    ? HOST_RPC_CLOSED_TEXT + DESKTOP_UNKNOWN_OUTCOME_SUFFIX
    : HOST_RPC_CLOSED_TEXT;
}
