import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process";
import { Duplex } from "node:stream";
import { HostUnreachableError } from "../errors.js";
import type { HostChannel, HostTransport, TransportHandlers } from "./transport.js";
import { openWebSocket } from "./wsTransport.js";

export interface CommandTransportOptions {
  command: string;
  args?: string[];
  /**
   * How the command's stdio carries messages. `lines`: one JSON message per LF-terminated line
   * (`codex app-server` on stdio). `websocket`: WebSocket frames (`codex app-server proxy` pipes bytes to
   * the running app-server's control socket, which speaks WebSocket).
   */
  framing?: "lines" | "websocket";
  /** Defaults to this process's environment, so CODEX_HOME reaches `codex app-server proxy`. */
  env?: NodeJS.ProcessEnv;
  cwd?: string;
}

/** The default: `codex app-server proxy`, bridging stdio to the app-server running for CODEX_HOME. */
export const defaultHostCommand: CommandTransportOptions = {
  command: "codex",
  args: ["app-server", "proxy"],
  framing: "websocket",
};

const stderrTail = 2_000;

/** A command whose stdio speaks the protocol. The child is killed when the channel closes. */
export function commandTransport(options: CommandTransportOptions = defaultHostCommand): HostTransport {
  const args = options.args ?? [];
  const describe = [options.command, ...args].join(" ");
  const framing = options.framing ?? "lines";
  return {
    describe,
    async connect(handlers: TransportHandlers, connectTimeoutMs: number): Promise<HostChannel> {
      const child = await spawnCommand(options, args, describe, connectTimeoutMs);
      return framing === "websocket"
        ? websocketOverStdio(child, describe, handlers, connectTimeoutMs)
        : linesOverStdio(child, handlers);
    },
  };
}

interface Spawned {
  process: ChildProcessWithoutNullStreams;
  /** Why the child ended: set once it exited, with its stderr's tail. */
  ended: Promise<string>;
}

function spawnCommand(
  options: CommandTransportOptions,
  args: string[],
  describe: string,
  connectTimeoutMs: number,
): Promise<Spawned> {
  return new Promise((resolve, reject) => {
    const child = spawn(options.command, args, {
      env: options.env ?? process.env,
      cwd: options.cwd,
      stdio: ["pipe", "pipe", "pipe"],
    });
    let stderr = "";
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (chunk: string) => {
      stderr = (stderr + chunk).slice(-stderrTail);
    });
    // A write to a child that just died raises EPIPE here; its exit reports it.
    child.stdin.on("error", () => {});
    const ended = new Promise<string>((settle) => {
      child.on("error", (e) => settle(`${describe}: cannot run: ${e.message}`));
      child.on("exit", (code, signal) => {
        const why = signal ? `signal ${signal}` : `exit code ${code}`;
        const tail = stderr.trim().split("\n").slice(-3).join(" | ");
        settle(`${describe}: host command ended (${why})${tail ? `: ${tail}` : ""}`);
      });
    });
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new HostUnreachableError("timeout", `${describe}: not started within ${connectTimeoutMs} ms`));
    }, connectTimeoutMs);
    child.once("spawn", () => {
      clearTimeout(timer);
      resolve({ process: child, ended });
    });
    ended.then((reason) => {
      clearTimeout(timer);
      reject(new HostUnreachableError("connect_failed", reason));
    });
  });
}

/** LF-only framing: a CR inside a JSON string is data. */
function linesOverStdio(child: Spawned, handlers: TransportHandlers): HostChannel {
  let closed = false;
  let buffered = "";
  child.process.stdout.setEncoding("utf8");
  child.process.stdout.on("data", (chunk: string) => {
    buffered += chunk;
    let newline = buffered.indexOf("\n");
    while (newline >= 0) {
      const line = buffered.slice(0, newline);
      buffered = buffered.slice(newline + 1);
      if (line.trim() !== "") handlers.onMessage(line);
      newline = buffered.indexOf("\n");
    }
  });
  child.ended.then((reason) => {
    closed = true;
    handlers.onClose(reason);
  });
  return {
    send(text: string) {
      if (!closed) child.process.stdin.write(`${text}\n`);
    },
    close() {
      if (!closed) child.process.kill("SIGTERM");
    },
  };
}

function websocketOverStdio(
  child: Spawned,
  describe: string,
  handlers: TransportHandlers,
  connectTimeoutMs: number,
): Promise<HostChannel> {
  const stream = Duplex.from({ readable: child.process.stdout, writable: child.process.stdin });
  // The HTTP client that carries the handshake treats its connection as a socket.
  const socketLike = stream as Duplex & Record<string, unknown>;
  for (const method of ["setNoDelay", "setTimeout", "setKeepAlive", "ref", "unref"]) {
    socketLike[method] = () => stream;
  }
  child.ended.then(() => stream.destroy());
  return openWebSocket(
    describe,
    "ws://localhost/",
    handlers,
    connectTimeoutMs,
    () => stream,
    () => {
      if (child.process.exitCode === null && child.process.signalCode === null) child.process.kill("SIGTERM");
    },
  );
}
