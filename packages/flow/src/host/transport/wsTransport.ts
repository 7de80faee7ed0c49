import WebSocket from "ws";
import { HostUnreachableError } from "../errors.js";
import type { HostChannel, HostTransport, TransportHandlers } from "./transport.js";

/** An app-server listening on `ws://IP:PORT` (`codex app-server --listen ws://…`): one message per frame. */
export function wsTransport(url: string): HostTransport {
  return {
    describe: url,
    connect(handlers: TransportHandlers, connectTimeoutMs: number): Promise<HostChannel> {
      return new Promise((resolve, reject) => {
        let opened = false;
        let closed = false;
        const socket = new WebSocket(url, { handshakeTimeout: connectTimeoutMs, perMessageDeflate: false });
        const finish = (reason: string) => {
          if (closed) return;
          closed = true;
          if (!opened) reject(new HostUnreachableError("connect_failed", `${url}: ${reason}`));
          else handlers.onClose(reason);
        };
        socket.on("open", () => {
          opened = true;
          resolve({
            send(text: string) {
              if (!closed && socket.readyState === WebSocket.OPEN) socket.send(text);
            },
            close() {
              socket.terminate();
            },
          });
        });
        socket.on("message", (data, isBinary) => {
          const text = isBinary ? Buffer.from(data as Buffer).toString("utf8") : data.toString();
          // A frame normally holds one message; a sender that batches lines is read the same way.
          for (const line of text.split("\n")) if (line.trim() !== "") handlers.onMessage(line);
        });
        socket.on("error", (e) => finish(e.message));
        socket.on("close", (code, reason) => finish(`closed (${code}${reason.length ? ` ${reason}` : ""})`));
      });
    },
  };
}
