import { spawn } from "node:child_process";

/** The uid and gid a server process runs as; undefined everywhere means the invoking user. */
export interface ServerUser {
  readonly name: string;
  readonly uid: number;
  readonly gid: number;
}

export interface Ran {
  /** Exit code; null when the process was killed or never started. */
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
  /** Set when the program could not be started at all (ENOENT, EACCES on a noexec mount, …). */
  readonly spawnError?: NodeJS.ErrnoException;
}

/** A bound on any helper program (id, useradd, test, initdb): none of them waits on anything but the disk. */
const RUN_TIMEOUT_MS = 120_000;

/**
 * Runs a program to its end, as `user` when given. A failure to start is a result, never an unhandled
 * `'error'` event: every caller turns it into a typed error that says why.
 */
export function run(
  file: string,
  args: readonly string[],
  options: { user?: ServerUser; input?: string; env?: NodeJS.ProcessEnv } = {},
): Promise<Ran> {
  return new Promise((resolveRun) => {
    let stdout = "";
    let stderr = "";
    let spawnError: NodeJS.ErrnoException | undefined;
    const child = spawn(file, args, {
      stdio: ["pipe", "pipe", "pipe"],
      env: options.env ?? process.env,
      ...(options.user && { uid: options.user.uid, gid: options.user.gid }),
    });
    // Our own bound, not spawn's `timeout`: that one's timer outlives a program that never started and
    // keeps the process alive after everything else has ended.
    const timer = setTimeout(() => child.kill("SIGKILL"), RUN_TIMEOUT_MS);
    timer.unref();
    child.stdout.on("data", (b: Buffer) => {
      stdout += b.toString("utf8");
    });
    child.stderr.on("data", (b: Buffer) => {
      stderr += b.toString("utf8");
    });
    // A program that exits before reading its input closes the pipe under us; its exit status says why.
    child.stdin.on("error", () => {});
    child.once("error", (e: NodeJS.ErrnoException) => {
      spawnError = e;
    });
    child.once("close", (code) => {
      clearTimeout(timer);
      resolveRun({ code, stdout, stderr, ...(spawnError && { spawnError }) });
    });
    child.stdin.end(options.input ?? "");
  });
}

/** Whether `user` can search (`x`) or write (`w`) `path`, every directory above it included. */
export async function userCan(user: ServerUser, test: "-x" | "-w", path: string): Promise<boolean> {
  const ran = await run("test", [test, path], { user });
  return ran.code === 0;
}
