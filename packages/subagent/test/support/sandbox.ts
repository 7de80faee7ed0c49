import { spawn } from "node:child_process";
import type { LocalExecFinal, LocalExecHandler } from "@crw/subagent";

export interface SandboxStart {
  pid: number;
  signal: AbortSignal;
  service: boolean;
  turnId: string;
  /** Partial events the daemon posted to the runner for this call. */
  emitted: number;
}

/**
 * The daemon's side of local execution, for real: each start runs a process here, streams process-started
 * and stdout, and settles on its exit. Cancellation (the call's signal) kills it.
 */
export function sandbox() {
  const started: SandboxStart[] = [];
  const handler: LocalExecHandler = (request, ctx) =>
    new Promise<LocalExecFinal>((resolve, reject) => {
      if (request.op !== "start") return reject(new Error("no stdin in this sandbox"));
      const [file, ...args] = request.command;
      const child = spawn(file as string, args, { stdio: ["ignore", "pipe", "ignore"] });
      let entry: SandboxStart | undefined;
      const emit: typeof ctx.emit = (event) => {
        if (entry) entry.emitted += 1;
        ctx.emit(event);
      };
      child.once("error", reject);
      child.once("spawn", () => {
        entry = {
          pid: child.pid as number,
          signal: ctx.signal,
          service: request.service,
          turnId: ctx.turnId,
          emitted: 0,
        };
        started.push(entry);
        emit({ kind: "process-started", processId: String(child.pid) });
      });
      child.stdout?.setEncoding("utf8").on("data", (d: string) => emit({ kind: "stdout", data: d }));
      ctx.signal.addEventListener("abort", () => child.kill("SIGKILL"), { once: true });
      child.once("exit", (exitCode, signal) => resolve({ exitCode, signal }));
    });
  return { handler, started };
}
