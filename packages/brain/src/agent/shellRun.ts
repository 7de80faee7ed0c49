import { spawn } from "node:child_process";
import { bwrapMissing, SANDBOX_STARTED_FD, sandboxInvocation, sandboxSetupError } from "./sandbox.js";

export interface ShellRun {
  readonly exitCode: number | null;
  readonly signal: string | null;
  readonly output: string;
  readonly timedOut: boolean;
}

export interface ShellLimits {
  readonly timeoutMs: number;
  readonly maxBytes: number;
  readonly signal?: AbortSignal | undefined;
}

/**
 * Runs `command` in the sandbox. bwrap leads its own process group, which timeout and abort kill; its
 * `--die-with-parent` and pid namespace take the command's descendants with it. A bwrap that exits before
 * the command started rejects with `SandboxUnavailableError`.
 */
export async function runShell(
  command: string,
  workDir: string,
  readOnly: boolean,
  limits: ShellLimits,
): Promise<ShellRun> {
  const sandbox = await sandboxInvocation(command, { workDir, readOnly });
  return new Promise<ShellRun>((resolvePromise, reject) => {
    const stdio = Array.from({ length: SANDBOX_STARTED_FD + 1 }, (_, fd) => (fd === 0 ? "ignore" : "pipe"));
    const child = spawn(sandbox.file, sandbox.args, {
      cwd: workDir,
      env: sandbox.env,
      detached: true,
      stdio: stdio as ("ignore" | "pipe")[],
    });
    let started = false;
    child.stdio[SANDBOX_STARTED_FD]?.on("data", () => {
      started = true;
    });
    const chunks: Buffer[] = [];
    let size = 0;
    const collect = (chunk: Buffer) => {
      chunks.push(chunk);
      size += chunk.length;
      while (size > limits.maxBytes && chunks.length > 1) size -= (chunks.shift() as Buffer).length;
    };
    child.stdout?.on("data", collect);
    child.stderr?.on("data", collect);
    let timedOut = false;
    let killed = false;
    const kill = () => {
      killed = true;
      try {
        if (child.pid) process.kill(-child.pid, "SIGKILL");
      } catch {
        // Already gone.
      }
    };
    const timer = setTimeout(() => {
      timedOut = true;
      kill();
    }, limits.timeoutMs);
    limits.signal?.addEventListener("abort", kill, { once: true });
    // An abort that came while the sandbox was being prepared has no event left to fire.
    if (limits.signal?.aborted) kill();
    child.on("error", (e) => {
      clearTimeout(timer);
      limits.signal?.removeEventListener("abort", kill);
      const code = (e as NodeJS.ErrnoException).code;
      const missing = code === "ENOENT" || code === "EACCES";
      reject(missing ? bwrapMissing(sandbox.file, sandbox.file) : sandboxSetupError(sandbox.file, e.message));
    });
    child.on("close", (exitCode, sig) => {
      clearTimeout(timer);
      limits.signal?.removeEventListener("abort", kill);
      let output = Buffer.concat(chunks).toString("utf8");
      if (!started && !killed) return reject(sandboxSetupError(sandbox.file, output));
      if (output.length > limits.maxBytes) output = output.slice(-limits.maxBytes);
      resolvePromise({ exitCode, signal: sig, output, timedOut });
    });
  });
}
