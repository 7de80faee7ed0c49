import { createServer, type IncomingMessage, type Server } from "node:http";
import type { Logger } from "pino";
import { type WebSocket, WebSocketServer } from "ws";
import { errorFrame, RPC_PARSE_ERROR, type RpcContext, RpcError } from "./rpc.js";

export type Authenticate = (token: string) => Promise<{ accountId: string } | undefined>;

export interface ApiServerOptions {
  host: string;
  port: number;
  /** Answers one decoded frame (undefined: nothing to send back). */
  handle: (frame: unknown, ctx: RpcContext) => Promise<object | undefined>;
  authenticate: Authenticate;
  /** The /health document; called per request. */
  health: () => Promise<object>;
  log: Logger;
  /** Largest frame a client may send (bytes); larger ones close the connection (1009). */
  maxFrameBytes?: number;
}

export interface ApiServer {
  readonly port: number;
  /** Stops accepting, closes every connection (1001) and waits for the HTTP server to close. */
  close(): Promise<void>;
}

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
      options.health().then(
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
        wss.handleUpgrade(req, socket, head, (ws) => serve(ws, who.accountId));
      },
      (e: unknown) => {
        log.error({ err: e }, "authentication failed");
        socket.end("HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\r\n");
      },
    );
  });

  function serve(ws: WebSocket, accountId: string): void {
    const abort = new AbortController();
    const conn = log.child({ accountId });
    const send = (frame: object) => {
      if (ws.readyState === ws.OPEN) ws.send(JSON.stringify(frame));
    };
    const ctx = {
      accountId,
      signal: abort.signal,
      notify: (method: string, params: unknown) => send({ jsonrpc: "2.0", method, params }),
    };
    ws.on("message", (data, isBinary) => {
      let frame: unknown;
      try {
        if (isBinary) throw new Error("binary frame");
        frame = JSON.parse(data.toString());
      } catch {
        send(errorFrame(null, new RpcError(RPC_PARSE_ERROR, "parse_error", "frame is not JSON text")));
        return;
      }
      handle(frame, ctx).then(
        (reply) => reply && send(reply),
        (e: unknown) => conn.error({ err: e }, "rpc handler escaped"),
      );
    });
    ws.on("close", () => abort.abort());
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
    close: async () => {
      for (const client of wss.clients) client.close(1001, "daemon stopping");
      wss.close();
      const closed = new Promise<void>((r) => http.close(() => r()));
      http.closeAllConnections();
      await closed;
    },
  };
}
