import { spawn } from "node:child_process";
import { HostUnreachableError } from "../errors.js";
import type { HostChannel, HostTransport, TransportHandlers } from "./transport.js";

export interface CommandTransportOptions {
  command: string;
  args?: string[];
  /** Defaults to this process's environment, so CODEX_HOME reaches `codex app-server proxy`. */
  env?: NodeJS.ProcessEnv;
  cwd?: string;
}

/** The default: `codex app-server proxy`, bridging stdio to the app-server running for CODEX_HOME. */
export const defaultHostCommand: CommandTransportOptions = {
  command: "codex",
  args: ["app-server", "proxy"],
};

const stderrTail = 2_000;

/**
 * A command whose stdin/stdout speak the protocol, one JSON message per LF-terminated line (LF only: a
 * CR inside a JSON string is data). The child is killed when the channel closes.
 */
export function commandTransport(options: CommandTransportOptions = defaultHostCommand): HostTransport {
  const args = options.args ?? [];
  const describe = [options.command, ...args].join(" ");
  return {
    describe,
    connect(handlers: TransportHandlers, connectTimeoutMs: number): Promise<HostChannel> {
      return new Promise((resolve, reject) => {
        const child = spawn(options.command, args, {
          env: options.env ?? process.env,
          cwd: options.cwd,
          stdio: ["pipe", "pipe", "pipe"],
        });
        let opened = false;
        let closed = false;
        let stderr = "";
        let buffered = "";
        const timer = setTimeout(() => {
          if (opened) return;
          child.kill("SIGKILL");
          reject(
            new HostUnreachableError("timeout", `${describe}: not started within ${connectTimeoutMs} ms`),
          );
        }, connectTimeoutMs);
        const finish = (reason: string) => {
          if (closed) return;
          closed = true;
          clearTimeout(timer);
          if (!opened) {
            reject(new HostUnreachableError("connect_failed", `${describe}: ${reason}`));
            return;
          }
          handlers.onClose(reason);
        };
        child.stdout.setEncoding("utf8");
        child.stdout.on("data", (chunk: string) => {
          buffered += chunk;
          let newline = buffered.indexOf("\n");
          while (newline >= 0) {
            const line = buffered.slice(0, newline);
            buffered = buffered.slice(newline + 1);
            if (line.trim() !== "") handlers.onMessage(line);
            newline = buffered.indexOf("\n");
          }
        });
        child.stderr.setEncoding("utf8");
        child.stderr.on("data", (chunk: string) => {
          stderr = (stderr + chunk).slice(-stderrTail);
        });
        // A write to a child that just died raises EPIPE here; the exit below reports it.
        child.stdin.on("error", () => {});
        child.on("error", (e) => finish(`cannot run: ${e.message}`));
        child.on("exit", (code, signal) => {
          const why = signal ? `signal ${signal}` : `exit code ${code}`;
          const tail = stderr.trim().split("\n").slice(-3).join(" | ");
          finish(`host command ended (${why})${tail ? `: ${tail}` : ""}`);
        });
        child.on("spawn", () => {
          opened = true;
          clearTimeout(timer);
          resolve({
            send(text: string) {
              if (!closed) child.stdin.write(`${text}\n`);
            },
            close() {
              if (!closed) child.kill("SIGTERM");
            },
          });
        });
      });
    },
  };
}
