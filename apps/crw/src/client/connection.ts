import { readFile } from "node:fs/promises";
import { join } from "node:path";
import WebSocket from "ws";

/** A refusal the user can act on: the message says what to do; `exitCode` 1 (refused) or 2 (input). */
export class ClientError extends Error {
  override readonly name = "ClientError";
  constructor(
    message: string,
    readonly code: string,
    readonly exitCode: 1 | 2 = 1,
  ) {
    super(message);
  }
}

export interface ConnectOptions {
  /** The daemon's data directory (its state file names the URL; its owner.token authenticates). */
  dataDir?: string | undefined;
  /**
   * A daemon URL (http://host:port), or several separated by commas (daemons of one database: the first
   * that answers is used); with it, a token from --token or CRW_TOKEN.
   */
  url?: string | undefined;
  token?: string | undefined;
}

interface Pending {
  resolve: (result: unknown) => void;
  reject: (e: Error) => void;
}

/**
 * One JSON-RPC connection to the daemon. Errors arrive as data (`error.data.code`) and become ClientErrors
 * with a hint; a connection that closes rejects every pending call at once.
 */
export class DaemonClient {
  #next = 1;
  readonly #pending = new Map<number, Pending>();
  readonly #listeners = new Set<(method: string, params: Record<string, unknown>) => void>();

  private constructor(private readonly ws: WebSocket) {
    ws.on("message", (data) => {
      let frame: Record<string, unknown>;
      try {
        frame = JSON.parse(data.toString()) as Record<string, unknown>;
      } catch {
        return;
      }
      if (typeof frame.id === "number") {
        const pending = this.#pending.get(frame.id);
        if (!pending) return;
        this.#pending.delete(frame.id);
        if (frame.error) pending.reject(rpcError(frame.error as RpcErrorData));
        else pending.resolve(frame.result);
      } else if (typeof frame.method === "string") {
        for (const l of this.#listeners) l(frame.method, (frame.params ?? {}) as Record<string, unknown>);
      }
    });
    ws.on("close", (code, reason) => {
      const revoked = code === 1008 && reason.toString() === "token revoked";
      for (const p of this.#pending.values())
        p.reject(
          revoked
            ? new ClientError(
                "the daemon closed the connection: its token was revoked; ask an administrator for a new one ('crw token issue')",
                "token_revoked",
              )
            : new ClientError(
                "the daemon closed the connection (it may be stopping); run the command again once 'crw daemon status' says it is up",
                "connection_closed",
              ),
        );
      this.#pending.clear();
    });
  }

  static async connect(options: ConnectOptions): Promise<DaemonClient> {
    const { urls, token } = await resolveEndpoint(options);
    let failed: ClientError | undefined;
    for (const url of urls) {
      try {
        return await DaemonClient.#open(url, token);
      } catch (e) {
        // a refused token is refused by every daemon of the database: trying the next one changes nothing
        if (!(e instanceof ClientError) || e.code !== "unreachable") throw e;
        failed = e;
      }
    }
    throw failed ?? new ClientError("no daemon URL to connect to", "no_url", 2);
  }

  static async #open(url: string, token: string): Promise<DaemonClient> {
    const ws = new WebSocket(`${url.replace(/^http/, "ws")}/rpc`, {
      headers: { authorization: `Bearer ${token}` },
    });
    await new Promise<void>((resolve, reject) => {
      ws.once("open", () => resolve());
      ws.once("unexpected-response", (_req, res) =>
        reject(
          res.statusCode === 401
            ? new ClientError(
                "the daemon refused the token; use the owner token in <data-dir>/owner.token, or pass --token / CRW_TOKEN",
                "unauthorized",
              )
            : res.statusCode === 503
              ? new ClientError(
                  "the daemon cannot reach its database now (HTTP 503); try again shortly ('crw daemon status' says why)",
                  "database_unavailable",
                )
              : new ClientError(`the daemon answered HTTP ${res.statusCode}`, "http_error"),
        ),
      );
      ws.once("error", (e) =>
        reject(
          new ClientError(
            `cannot reach the daemon at ${url} (${e.message}); start it with 'crw daemon start'`,
            "unreachable",
          ),
        ),
      );
    });
    return new DaemonClient(ws);
  }

  onNotification(listener: (method: string, params: Record<string, unknown>) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  call<T = Record<string, unknown>>(method: string, params: object = {}): Promise<T> {
    const id = this.#next++;
    return new Promise<T>((resolve, reject) => {
      this.#pending.set(id, { resolve: (r) => resolve(r as T), reject });
      this.ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
    });
  }

  /** The connection has ended (closed by either side); every later call would fail. */
  get closed(): boolean {
    return this.ws.readyState === WebSocket.CLOSING || this.ws.readyState === WebSocket.CLOSED;
  }

  close(): void {
    this.ws.close();
  }
}

interface RpcErrorData {
  code: number;
  message: string;
  data?: { name?: string; code?: string };
}

const HINTS: Record<string, string> = {
  not_found: "check the id (it must belong to your account); 'crw session create' makes a new session",
  cross_account: "that session belongs to another account",
  invalid_params: "check the command's arguments ('--help')",
  daemon_stopping: "the daemon is stopping; start it again with 'crw daemon start'",
  workflow_not_found: "check the workflow id (it must belong to your account)",
  not_root: "messages go to a root session; follow a child with 'crw tap'",
  not_permitted: "ask the owner or an administrator",
  database_unavailable: "'crw daemon status' shows the database's state",
};

function rpcError(e: RpcErrorData): ClientError {
  const code = e.data?.code ?? "error";
  const hint =
    HINTS[code] ??
    (e.data?.name === "WorkflowDefinitionError" ? "fix the definition file and run again" : undefined);
  return new ClientError(
    hint ? `${e.message} (${hint})` : e.message,
    code,
    code === "invalid_params" ? 2 : 1,
  );
}

async function resolveEndpoint(options: ConnectOptions): Promise<{ urls: string[]; token: string }> {
  if (options.url) {
    const token = options.token ?? process.env.CRW_TOKEN;
    if (!token) throw new ClientError("--url needs a token: pass --token or set CRW_TOKEN", "no_token", 2);
    const urls = options.url
      .split(",")
      .map((u) => u.trim().replace(/\/$/, ""))
      .filter(Boolean);
    return { urls, token };
  }
  const { defaultDataDir, readState, ownerTokenPath } = await import("@crw/daemon/control");
  const dataDir = options.dataDir ?? defaultDataDir();
  const state = await readState(dataDir);
  if (!state)
    throw new ClientError(
      `no daemon runs on ${dataDir}; start it with 'crw daemon start${options.dataDir ? ` --data-dir ${dataDir}` : ""}'`,
      "not_running",
    );
  let token = options.token ?? process.env.CRW_TOKEN;
  if (!token) {
    try {
      token = (await readFile(ownerTokenPath(dataDir), "utf8")).trim();
    } catch {
      throw new ClientError(
        `no token: ${join(dataDir, "owner.token")} is not readable; pass --token or set CRW_TOKEN`,
        "no_token",
      );
    }
  }
  return { urls: [state.url], token };
}
