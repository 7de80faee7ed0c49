import { HostRpcError, HostUnreachableError } from "./errors.js";
import type { HostChannel, HostTransport } from "./transport/transport.js";

/**
 * One JSON-RPC session with an app-server: newline-delimited messages without a "jsonrpc" member,
 * requests with numeric ids, every request bounded by a timeout, and every pending request rejected at
 * once with `HostUnreachableError("closed")` when the channel dies. Server-to-client requests (approvals,
 * elicitations) are answered with an error: crw never approves on the owner's behalf.
 */

interface IncomingFrame {
  id?: unknown;
  method?: string;
  params?: unknown;
  result?: unknown;
  error?: { code: number; message: string };
}

const isObject = (v: unknown): v is Record<string, unknown> =>
  v !== null && typeof v === "object" && !Array.isArray(v);

/**
 * A frame is an error answer, a request, an answer or a notification; anything else is a bad frame (the
 * reason says why). Checked by hand: every frame of every thread passes here, and a schema union costs more
 * per frame than the rest of the frame's handling.
 */
function incomingFrame(raw: unknown): IncomingFrame | string {
  if (!isObject(raw)) return "a frame is a JSON object";
  if (typeof raw.method === "string") return raw as IncomingFrame;
  if (typeof raw.id !== "number" && typeof raw.id !== "string")
    return "a frame has a method, or an id that is a number or a string";
  const error = raw.error;
  if (isObject(error) && typeof error.code === "number" && typeof error.message === "string")
    return raw as IncomingFrame;
  if ("result" in raw) return raw as IncomingFrame;
  return "an answer has a result or an error with a numeric code and a message";
}

export interface RpcNotification {
  method: string;
  params: unknown;
}

export type RpcEvent =
  | { type: "notification"; notification: RpcNotification }
  | { type: "server_request_refused"; method: string }
  | { type: "bad_frame"; error: string; frame: string }
  | { type: "closed"; reason: string };

interface Pending {
  method: string;
  resolve(value: unknown): void;
  reject(error: Error): void;
  timer: NodeJS.Timeout;
}

export class RpcConnection {
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private channel: HostChannel | null = null;
  private closedReason: string | null = null;

  private constructor(
    private readonly describe: string,
    private readonly onEvent: (event: RpcEvent) => void,
  ) {}

  static async open(
    transport: HostTransport,
    connectTimeoutMs: number,
    onEvent: (event: RpcEvent) => void,
  ): Promise<RpcConnection> {
    const connection = new RpcConnection(transport.describe, onEvent);
    connection.channel = await transport.connect(
      {
        onMessage: (text) => connection.receive(text),
        onClose: (reason) => connection.closed(reason),
      },
      connectTimeoutMs,
    );
    return connection;
  }

  get isOpen(): boolean {
    return this.closedReason === null;
  }

  request(method: string, params: unknown, timeoutMs: number): Promise<unknown> {
    if (this.closedReason !== null || !this.channel) {
      return Promise.reject(
        new HostUnreachableError("closed", `${this.describe}: ${this.closedReason ?? "not open"}`, method),
      );
    }
    const id = this.nextId++;
    const channel = this.channel;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new HostUnreachableError("timeout", `${method}: no answer within ${timeoutMs} ms`, method));
      }, timeoutMs);
      this.pending.set(id, { method, resolve, reject, timer });
      channel.send(JSON.stringify({ id, method, params }));
    });
  }

  notify(method: string, params?: unknown): void {
    if (this.closedReason !== null || !this.channel) return;
    this.channel.send(JSON.stringify(params === undefined ? { method } : { method, params }));
  }

  close(): void {
    this.channel?.close();
    this.closed("closed by the client");
  }

  private receive(text: string): void {
    let raw: unknown;
    try {
      raw = JSON.parse(text);
    } catch (e) {
      this.onEvent({ type: "bad_frame", error: (e as Error).message, frame: text.slice(0, 500) });
      return;
    }
    const message = incomingFrame(raw);
    if (typeof message === "string") {
      this.onEvent({ type: "bad_frame", error: message, frame: text.slice(0, 500) });
      return;
    }
    if (message.id !== undefined && message.method !== undefined) {
      // A request from the server: refuse it rather than leave the server waiting.
      this.onEvent({ type: "server_request_refused", method: message.method });
      this.channel?.send(
        JSON.stringify({
          id: message.id,
          error: { code: -32601, message: `crw does not serve ${message.method}` },
        }),
      );
      return;
    }
    if (message.id !== undefined) {
      const pending = typeof message.id === "number" ? this.pending.get(message.id) : undefined;
      if (!pending) return; // an answer after its timeout: nobody waits for it any more
      this.pending.delete(message.id as number);
      clearTimeout(pending.timer);
      if (message.error) {
        pending.reject(new HostRpcError(pending.method, message.error.code, message.error.message));
      } else {
        pending.resolve(message.result);
      }
      return;
    }
    this.onEvent({
      type: "notification",
      notification: { method: message.method ?? "", params: message.params },
    });
  }

  private closed(reason: string): void {
    if (this.closedReason !== null) return;
    this.closedReason = reason;
    for (const [id, pending] of this.pending) {
      clearTimeout(pending.timer);
      this.pending.delete(id);
      pending.reject(new HostUnreachableError("closed", `${this.describe}: ${reason}`, pending.method));
    }
    this.onEvent({ type: "closed", reason });
  }
}
