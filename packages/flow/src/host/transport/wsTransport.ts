import type { Duplex } from "node:stream";
import WebSocket from "ws";
import { HostUnreachableError } from "../errors.js";
import type { HostChannel, HostTransport, TransportHandlers } from "./transport.js";

/**
 * An app-server speaking WebSocket: `ws://IP:PORT` (`codex app-server --listen ws://…`), or its control
 * socket `unix://PATH` (`--listen unix://PATH`, which speaks WebSocket over the Unix socket). One message
 * per text frame.
 */
export function wsTransport(url: string): HostTransport {
  const unix = /^unix:\/\//i.test(url) ? url.slice("unix://".length) : null;
  const target = unix === null ? url : `ws+unix://${unix}:/`;
  return {
    describe: url,
    connect: (handlers, connectTimeoutMs) => openWebSocket(url, target, handlers, connectTimeoutMs),
  };
}

/**
 * The WebSocket handshake and framing over any byte stream (`createConnection`), or over TCP / a Unix
 * socket when none is given. Resolves once the handshake is done; `onClose` is called once afterwards.
 */
export function openWebSocket(
  describe: string,
  url: string,
  handlers: TransportHandlers,
  connectTimeoutMs: number,
  createConnection?: () => Duplex,
  onChannelClose?: () => void,
): Promise<HostChannel> {
  return new Promise((resolve, reject) => {
    let opened = false;
    let closed = false;
    const socket = new WebSocket(url, {
      handshakeTimeout: connectTimeoutMs,
      perMessageDeflate: false,
      maxPayload: 256 * 1024 * 1024,
      ...(createConnection ? { createConnection: createConnection as never } : {}),
    });
    const finish = (reason: string) => {
      if (closed) return;
      closed = true;
      onChannelClose?.();
      if (!opened) reject(new HostUnreachableError("connect_failed", `${describe}: ${reason}`));
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
}
