import { isDatabaseUnavailable } from "@crw/db";
import type { Logger } from "pino";
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
  /** Where an internal failure is logged in full (the client gets only its typed code). */
  readonly log?: Logger;
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

type RequestId = string | number | null;

/**
 * The id a reply carries. JSON-RPC ids are strings or numbers; absent means a notification (`undefined`).
 * Any other id (object, array, boolean, null) makes the frame an invalid request, answered with id null.
 */
export function requestIdOf(frame: unknown): { valid: boolean; id: RequestId | undefined } {
  if (typeof frame !== "object" || frame === null || !("id" in frame)) return { valid: true, id: undefined };
  const id = (frame as { id: unknown }).id;
  // 1e400 parses to Infinity, which no reply could carry back (JSON writes it as null)
  if (typeof id === "string" || (typeof id === "number" && Number.isFinite(id))) return { valid: true, id };
  return { valid: false, id: null };
}

/**
 * The path of the first string (value or key) holding U+0000, if any. PostgreSQL text and jsonb cannot
 * store it (SQLSTATE 22021 / 22P05), so it is refused where params are read, before a handler runs.
 */
export function nulPath(value: unknown): string | undefined {
  // iterative: params nested thousands deep must be answered, not overflow the stack
  const stack: { value: unknown; path: string[] }[] = [{ value, path: [] }];
  for (let next = stack.pop(); next; next = stack.pop()) {
    const { value: v, path } = next;
    if (typeof v === "string") {
      if (v.includes("\u0000")) return path.join(".") || "params";
      continue;
    }
    if (typeof v !== "object" || v === null) continue;
    for (const [key, item] of Object.entries(v)) {
      if (key.includes("\u0000")) return [...path, "(key)"].join(".");
      stack.push({ value: item, path: [...path, key] });
    }
  }
  return undefined;
}

/** A PostgreSQL driver error (pg's DatabaseError: name "error", a five-character SQLSTATE, a severity). */
function isDatabaseError(e: unknown): boolean {
  const err = e as { name?: unknown; code?: unknown; severity?: unknown } | null;
  return (
    typeof err === "object" &&
    err !== null &&
    typeof err.code === "string" &&
    /^[0-9A-Z]{5}$/.test(err.code) &&
    (err.name === "error" || typeof err.severity === "string")
  );
}

/** What a client sees of a failure whose details are the daemon's own (a driver error, its SQLSTATE). */
const internalError = () => new RpcError(RPC_INTERNAL, "internal", "internal error", "InternalError");

export class RpcRegistry {
  readonly #methods = new Map<string, RpcMethod>();

  register<S extends z.ZodType>(name: string, method: RpcMethod<S>): void {
    if (this.#methods.has(name)) throw new Error(`rpc method ${name} registered twice`);
    this.#methods.set(name, method as unknown as RpcMethod);
  }

  names(): string[] {
    return [...this.#methods.keys()].sort();
  }

  /**
   * Answers one decoded frame; undefined for a notification from the client (nothing to answer). Whatever
   * throws on the way is answered as a typed error, never left to reject.
   */
  async handle(frame: unknown, ctx: RpcContext): Promise<object | undefined> {
    try {
      return await this.#answer(frame, ctx);
    } catch (e) {
      ctx.log?.error({ err: e }, "an rpc request failed before its handler");
      const { valid, id } = requestIdOf(frame);
      if (valid && id === undefined) return undefined;
      const tooDeep = e instanceof RangeError;
      return errorFrame(
        id ?? null,
        tooDeep
          ? new RpcError(RPC_INVALID_PARAMS, "invalid_params", "the request nests too deep")
          : internalError(),
      );
    }
  }

  async #answer(frame: unknown, ctx: RpcContext): Promise<object | undefined> {
    const req = frame as { jsonrpc?: unknown; method?: unknown; params?: unknown };
    const { valid, id: given } = requestIdOf(frame);
    const id = given ?? null;
    if (
      !valid ||
      typeof req !== "object" ||
      req === null ||
      req.jsonrpc !== "2.0" ||
      typeof req.method !== "string"
    )
      return errorFrame(
        id,
        new RpcError(
          RPC_INVALID_REQUEST,
          "invalid_request",
          "not a JSON-RPC 2.0 request (ids are strings or numbers)",
        ),
      );
    const method = this.#methods.get(req.method);
    if (!method)
      return errorFrame(
        id,
        new RpcError(RPC_METHOD_NOT_FOUND, "method_not_found", `no method ${req.method}`),
      );
    const nul = nulPath(req.params);
    if (nul !== undefined)
      return errorFrame(
        id,
        new RpcError(RPC_INVALID_PARAMS, "invalid_params", `${nul}: U+0000 is not allowed`),
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
      return given === undefined ? undefined : { jsonrpc: "2.0", id, result: result ?? null };
    } catch (e) {
      // errorFrame answers it as a bare internal error; its driver details are kept for the daemon's log.
      if (isDatabaseError(e))
        ctx.log?.error({ err: e, method: req.method }, "database error escaped an rpc handler");
      return given === undefined ? undefined : errorFrame(id, e);
    }
  }
}

/** A request refused because the database cannot be reached now; the same request later may succeed. */
export const databaseUnavailable = () =>
  new RpcError(
    RPC_REFUSED,
    "database_unavailable",
    "the database does not answer; the daemon is waiting for it to come back: try again shortly",
    "DatabaseUnavailableError",
  );

export function errorFrame(id: RequestId, e: unknown): object {
  // A driver error never crosses as such: its message and SQLSTATE are the daemon's business.
  const err = isDatabaseUnavailable(e)
    ? databaseUnavailable()
    : isDatabaseError(e)
      ? internalError()
      : e instanceof Error
        ? e
        : new Error(String(e));
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
