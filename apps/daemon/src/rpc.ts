import type { z } from "zod";

/**
 * JSON-RPC 2.0 over one WebSocket connection. Each method declares a zod schema for its params; a request
 * that fails it is answered `invalid_params` and never reaches the handler. Errors cross as data:
 * `{ code, message, data: { name, code } }`, matched by clients on `data.code`, never on a message text.
 */
export interface RpcContext {
  /** The authenticated account the connection speaks for. */
  readonly accountId: string;
  /** Sends a notification (no id) to this connection. */
  notify(method: string, params: unknown): void;
  /** Aborted when the connection closes. */
  readonly signal: AbortSignal;
}

export interface RpcMethod<S extends z.ZodType = z.ZodType> {
  params: S;
  handler: (params: z.infer<S>, ctx: RpcContext) => Promise<unknown>;
}

export class RpcError extends Error {
  constructor(
    readonly rpcCode: number,
    readonly code: string,
    message: string,
    override readonly name = "RpcError",
  ) {
    super(message);
  }
}

export const RPC_PARSE_ERROR = -32700;
export const RPC_INVALID_REQUEST = -32600;
export const RPC_METHOD_NOT_FOUND = -32601;
export const RPC_INVALID_PARAMS = -32602;
export const RPC_INTERNAL = -32603;
/** Application errors (refusals the caller can act on). */
export const RPC_REFUSED = -32000;

export class RpcRegistry {
  readonly #methods = new Map<string, RpcMethod>();

  register<S extends z.ZodType>(name: string, method: RpcMethod<S>): void {
    if (this.#methods.has(name)) throw new Error(`rpc method ${name} registered twice`);
    this.#methods.set(name, method as unknown as RpcMethod);
  }

  names(): string[] {
    return [...this.#methods.keys()].sort();
  }

  /** Answers one decoded frame; undefined for a notification from the client (nothing to answer). */
  async handle(frame: unknown, ctx: RpcContext): Promise<object | undefined> {
    const req = frame as { jsonrpc?: unknown; id?: unknown; method?: unknown; params?: unknown };
    const id = typeof req?.id === "string" || typeof req?.id === "number" ? req.id : null;
    if (typeof req !== "object" || req === null || req.jsonrpc !== "2.0" || typeof req.method !== "string")
      return errorFrame(
        id,
        new RpcError(RPC_INVALID_REQUEST, "invalid_request", "not a JSON-RPC 2.0 request"),
      );
    const method = this.#methods.get(req.method);
    if (!method)
      return errorFrame(
        id,
        new RpcError(RPC_METHOD_NOT_FOUND, "method_not_found", `no method ${req.method}`),
      );
    const parsed = method.params.safeParse(req.params ?? {});
    if (!parsed.success)
      return errorFrame(
        id,
        new RpcError(
          RPC_INVALID_PARAMS,
          "invalid_params",
          parsed.error.issues.map((i) => `${i.path.join(".") || "params"}: ${i.message}`).join("; "),
        ),
      );
    try {
      const result = await method.handler(parsed.data, ctx);
      return id === null ? undefined : { jsonrpc: "2.0", id, result: result ?? null };
    } catch (e) {
      return id === null ? undefined : errorFrame(id, e);
    }
  }
}

export function errorFrame(id: string | number | null, e: unknown): object {
  const err = e instanceof Error ? e : new Error(String(e));
  const coded = err as Error & { rpcCode?: number; code?: unknown };
  const code = typeof coded.code === "string" ? coded.code : "internal";
  const rpcCode =
    typeof coded.rpcCode === "number" ? coded.rpcCode : code === "internal" ? RPC_INTERNAL : RPC_REFUSED;
  return {
    jsonrpc: "2.0",
    id,
    error: { code: rpcCode, message: err.message, data: { name: err.name, code } },
  };
}
