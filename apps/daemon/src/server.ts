import { createHash } from "node:crypto";
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { Logger } from "pino";
import { type WebSocket, WebSocketServer } from "ws";
import { errorFrame, RPC_PARSE_ERROR, RPC_REFUSED, type RpcContext, RpcError, requestIdOf } from "./rpc.js";

export type Authenticate = (token: string) => Promise<{ accountId: string } | undefined>;

/** Policy violation: the token a connection was opened with no longer authenticates. */
export const CLOSE_TOKEN_REVOKED = 1008;

export interface ApiServerOptions {
  host: string;
  port: number;
  /** Answers one decoded frame (undefined: nothing to send back). */
  handle: (frame: unknown, ctx: RpcContext) => Promise<object | undefined>;
  authenticate: Authenticate;
  /** The /health document; called per request. */
  health: () => Promise<object>;
  /**
   * The /health document as one account may see it (the ids it owns; the owner's is whole). Without a
   * valid token /health answers liveness only.
   */
  healthFor: (accountId: string, doc: object) => Promise<object>;
  log: Logger;
  /** Largest frame a client may send (bytes); larger ones close the connection (1009). */
  maxFrameBytes?: number;
  /** Requests one connection may have running; more are refused `too_many_requests`, not queued. */
  maxInFlight?: number;
  /** Unread output a connection may hold (ws.bufferedAmount); past it the connection is closed (1008). */
  maxBufferedBytes?: number;
}

const MAX_IN_FLIGHT = 32;
const MAX_BUFFERED_BYTES = 16 * 1024 * 1024;
/** Policy violation: the client does not read what it asked for. */
const CLOSE_UNREAD = 1008;

export interface ApiServer {
  readonly port: number;
  /** Closes every connection opened with this token (its sha-256, hex): it was revoked. */
  dropToken(hashHex: string): number;
  /** The sha-256 of each token an open connection was opened with. */
  openTokens(): Buffer[];
  /** Stops accepting, closes every connection (1001) and waits for the HTTP server to close. */
  close(): Promise<void>;
}

const hashOf = (token: string) => createHash("sha256").update(token, "utf8").digest("hex");

function bearer(req: IncomingMessage): string | undefined {
  const header = req.headers.authorization;
  const m = header ? /^Bearer\s+(\S+)$/i.exec(header) : null;
  return m?.[1];
}

/** HTTP `/health` and the JSON-RPC WebSocket at `/rpc` (bearer token per account) on one port. */
export async function startApiServer(options: ApiServerOptions): Promise<ApiServer> {
  const { handle, log } = options;
  const http: Server = createServer((req, res) => {
    if (req.method === "GET" && (req.url === "/health" || req.url?.startsWith("/health?"))) {
      health(req).then(
        (doc) => {
          res.writeHead(200, { "content-type": "application/json" }).end(`${JSON.stringify(doc)}\n`);
        },
        (e: unknown) => {
          log.error({ err: e }, "health failed");
          res.writeHead(500, { "content-type": "application/json" }).end('{"status":"error"}\n');
        },
      );
      return;
    }
    res.writeHead(404, { "content-type": "application/json" }).end('{"error":"not_found"}\n');
  });

  /** Liveness for anyone; the document (its ids scoped to the account) only with a valid token. */
  async function health(req: IncomingMessage): Promise<object> {
    const doc = await options.health();
    const token = bearer(req);
    const status = (doc as { status?: unknown }).status;
    let who: { accountId: string } | undefined;
    try {
      who = token ? await options.authenticate(token) : undefined;
    } catch {
      // the token cannot be checked while the database is lost: whoever presented one learns why, and
      // nothing that only an account may see
      const database = (doc as { database?: { ok?: unknown; error?: unknown; since?: unknown } }).database;
      return {
        ok: false,
        status,
        database: { ok: database?.ok, error: database?.error, since: database?.since },
      };
    }
    if (who) return options.healthFor(who.accountId, doc);
    return { ok: status === "ok", status };
  }
  const wss = new WebSocketServer({ noServer: true, maxPayload: options.maxFrameBytes ?? 4 * 1024 * 1024 });

  http.on("upgrade", (req, socket, head) => {
    if (req.url !== "/rpc") {
      socket.end("HTTP/1.1 404 Not Found\r\nConnection: close\r\n\r\n");
      return;
    }
    const token = bearer(req);
    const refuse = () => socket.end("HTTP/1.1 401 Unauthorized\r\nConnection: close\r\n\r\n");
    if (!token) return refuse();
    options.authenticate(token).then(
      (who) => {
        if (!who) return refuse();
        wss.handleUpgrade(req, socket, head, (ws) => serve(ws, who.accountId, hashOf(token)));
      },
      (e: unknown) => {
        log.error({ err: e }, "authentication failed");
        socket.end("HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\r\n");
      },
    );
  });

  const maxInFlight = options.maxInFlight ?? MAX_IN_FLIGHT;
  const maxBuffered = options.maxBufferedBytes ?? MAX_BUFFERED_BYTES;

  /** Open connections by the sha-256 (hex) of the token each was opened with. */
  const byToken = new Map<string, Set<WebSocket>>();
  const aborts = new WeakMap<WebSocket, AbortController>();
  /**
   * Tokens revoked while this server runs: a connection authenticated just before its token's revocation
   * committed, and upgraded after the notice came, is refused here rather than kept.
   */
  const revoked = new Set<string>();
  const cutOff = (ws: WebSocket) => {
    aborts.get(ws)?.abort();
    ws.close(CLOSE_TOKEN_REVOKED, "token revoked");
    // a client that does not answer the close handshake is cut off all the same
    setTimeout(() => ws.terminate(), 2_000).unref();
  };

  function serve(ws: WebSocket, accountId: string, tokenHash: string): void {
    const abort = new AbortController();
    aborts.set(ws, abort);
    const mine = byToken.get(tokenHash) ?? new Set<WebSocket>();
    byToken.set(tokenHash, mine.add(ws));
    if (revoked.has(tokenHash)) cutOff(ws);
    const conn = log.child({ accountId });
    let inFlight = 0;
    // A client that does not read would otherwise hold every reply in this process's memory.
    const send = (frame: object) => {
      if (ws.readyState !== ws.OPEN) return;
      ws.send(JSON.stringify(frame));
      if (ws.bufferedAmount <= maxBuffered) return;
      conn.warn(
        { bufferedBytes: ws.bufferedAmount, limit: maxBuffered },
        "closing a connection that does not read",
      );
      abort.abort();
      ws.close(CLOSE_UNREAD, "unread output over the limit; read replies before sending more");
    };
    const ctx = {
      accountId,
      signal: abort.signal,
      log: conn,
      notify: (method: string, params: unknown) => send({ jsonrpc: "2.0", method, params }),
    };
    ws.on("message", (data, isBinary) => {
      if (ws.readyState !== ws.OPEN) return;
      let frame: unknown;
      try {
        if (isBinary) throw new Error("binary frame");
        frame = JSON.parse(data.toString());
      } catch {
        send(errorFrame(null, new RpcError(RPC_PARSE_ERROR, "parse_error", "frame is not JSON text")));
        return;
      }
      if (inFlight >= maxInFlight) {
        const { id } = requestIdOf(frame);
        if (id !== undefined) send(errorFrame(id, tooManyRequests(maxInFlight)));
        return;
      }
      inFlight++;
      handle(frame, ctx)
        .then(
          (reply) => reply && send(reply),
          (e: unknown) => conn.error({ err: e }, "rpc handler escaped"),
        )
        .finally(() => inFlight--);
    });
    ws.on("close", () => {
      abort.abort();
      mine.delete(ws);
      if (mine.size === 0 && byToken.get(tokenHash) === mine) byToken.delete(tokenHash);
    });
    ws.on("error", (e) => conn.warn({ err: e }, "websocket error"));
  }

  await new Promise<void>((resolveListen, reject) => {
    http.once("error", reject);
    http.listen(options.port, options.host, () => resolveListen());
  });
  const addr = http.address();
  const port = typeof addr === "object" && addr ? addr.port : options.port;
  return {
    port,
    dropToken: (hashHex) => {
      if (revoked.size >= 100_000) revoked.clear();
      revoked.add(hashHex);
      const open = [...(byToken.get(hashHex) ?? [])];
      if (open.length > 0)
        log.info(
          { token: hashHex.slice(0, 12), connections: open.length },
          "token revoked: closing its connections",
        );
      for (const ws of open) cutOff(ws);
      return open.length;
    },
    openTokens: () => [...byToken.keys()].map((h) => Buffer.from(h, "hex")),
    close: async () => {
      for (const client of wss.clients) client.close(1001, "daemon stopping");
      wss.close();
      const closed = new Promise<void>((r) => http.close(() => r()));
      http.closeAllConnections();
      await closed;
    },
  };
}

function tooManyRequests(limit: number): RpcError {
  return new RpcError(
    RPC_REFUSED,
    "too_many_requests",
    `${limit} requests of this connection are running; wait for their replies`,
  );
}
