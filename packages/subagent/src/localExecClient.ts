import { randomUUID } from "node:crypto";
import { LocalExecSessionClosedError } from "./errors.js";
import {
  HOST_RPC_CLOSED_TEXT,
  HostRpcClosedError,
  HostRpcRefusedError,
  HostRpcRemoteError,
} from "./hostRpc.js";
import type { RemoteError } from "./protocol/envelope.js";
import type { LocalExecEvent, LocalExecFinal, LocalExecRequest } from "./protocol/localExec.js";
import type { OutputFrame } from "./protocol/output.js";
import { currentDispatchedTurn } from "./rpcTurn.js";

interface Call {
  readonly turnId: string;
  readonly service: boolean;
  readonly onEvent: (event: LocalExecEvent) => void;
  readonly resolve: (final: LocalExecFinal) => void;
  readonly reject: (error: Error) => void;
  started: (processId: string) => void;
  detach: () => void;
}

export interface LocalExecCall {
  readonly callId: string;
  /** Resolves with the process id once the daemon reports process-started. */
  readonly started: Promise<string>;
  /** The one final result (exit) or error that settles the call. */
  readonly final: Promise<LocalExecFinal>;
}

/**
 * Runner side of local execution. A call is bound to its dispatched turn: the turn's abort cancels it —
 * until a background service reports process-started; then it is retained in this process registry and
 * only the registry (`cancel`, `stopServices`) or the channel's close ends it. Cancellation sends the
 * original call and turn ids. Nothing is retried or replayed.
 */
export class LocalExecClient {
  readonly #calls = new Map<string, Call>();
  /** The process registry of admitted services: call id -> turn id. */
  readonly #services = new Map<string, string>();
  #closed = false;

  constructor(private readonly send: (frame: OutputFrame) => boolean) {}

  get serviceCount(): number {
    return this.#services.size;
  }

  call(request: LocalExecRequest, onEvent: (event: LocalExecEvent) => void = () => {}): LocalExecCall {
    const turn = currentDispatchedTurn();
    const callId = randomUUID();
    if (!turn || this.#closed) {
      const error = !turn
        ? new HostRpcRefusedError("outside_turn", "local execution outside a dispatched turn")
        : new HostRpcClosedError(HOST_RPC_CLOSED_TEXT);
      const failed = Promise.reject(error);
      failed.catch(() => {});
      return { callId, started: failed as Promise<string>, final: failed as Promise<LocalExecFinal> };
    }
    let started: (processId: string) => void = () => {};
    let startFailed: (error: Error) => void = () => {};
    const startedPromise = new Promise<string>((resolve, reject) => {
      started = resolve;
      startFailed = reject;
    });
    startedPromise.catch(() => {});
    const final = new Promise<LocalExecFinal>((resolve, reject) => {
      const onAbort = () => this.cancel(callId);
      turn.signal.addEventListener("abort", onAbort, { once: true });
      this.#calls.set(callId, {
        turnId: turn.turnId,
        service: request.op === "start" && request.service,
        onEvent,
        resolve,
        reject: (e) => {
          startFailed(e);
          reject(e);
        },
        started: (processId) => started(processId),
        detach: () => turn.signal.removeEventListener("abort", onAbort),
      });
      if (!this.send({ type: "localExec", requestId: callId, turnId: turn.turnId, request })) {
        this.#settle(callId, {
          error: { name: "HostRpcClosedError", code: "host_rpc_closed", message: HOST_RPC_CLOSED_TEXT },
        });
      }
    });
    return { callId, started: startedPromise, final };
  }

  /** Registry cancellation: hostCancel with the original call and turn ids. */
  cancel(callId: string): boolean {
    const call = this.#calls.get(callId);
    if (!call) return false;
    this.send({ type: "localExecCancel", requestId: randomUUID(), callId, turnId: call.turnId });
    return true;
  }

  /** Cancel every admitted service (e.g. a Stop of the services a session started). */
  stopServices(): number {
    let n = 0;
    for (const callId of this.#services.keys()) if (this.cancel(callId)) n++;
    return n;
  }

  event(callId: string, event: LocalExecEvent): void {
    const call = this.#calls.get(callId);
    if (!call) return;
    if (event.kind === "process-started") {
      if (call.service) {
        // Admitted: from here on the turn's end does not cancel it.
        call.detach();
        this.#services.set(callId, call.turnId);
      }
      call.started(event.processId);
    }
    call.onEvent(event);
  }

  settle(callId: string, result: { ok: LocalExecFinal } | { error: RemoteError }): void {
    this.#settle(callId, result);
  }

  /** The daemon channel closed: every open call, retained services included, ends with session.closed. */
  close(): void {
    this.#closed = true;
    const closed = new LocalExecSessionClosedError();
    for (const callId of [...this.#calls.keys()]) {
      this.#settle(callId, { error: { name: closed.name, code: closed.code, message: closed.message } });
    }
  }

  #settle(callId: string, result: { ok: LocalExecFinal } | { error: RemoteError }): void {
    const call = this.#calls.get(callId);
    if (!call) return;
    this.#calls.delete(callId);
    this.#services.delete(callId);
    call.detach();
    if ("error" in result) {
      call.reject(
        result.error.name === "HostRpcClosedError"
          ? new HostRpcClosedError(result.error.message)
          : result.error.name === "LocalExecSessionClosedError"
            ? new LocalExecSessionClosedError(result.error.message)
            : new HostRpcRemoteError(result.error),
      );
    } else call.resolve(result.ok);
  }
}
