import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync } from "node:fs";

/**
 * Processes a liveness test needs, made for real: a live unrelated one, a zombie, a pid that is gone.
 * Every process made here is kept in the kit's list; `killAll` ends them (the tests' afterAll).
 */
export class TestProcesses {
  readonly #children: ChildProcess[] = [];

  /** `/proc/<pid>/stat`'s state (field 3) and start time (field 22), read after the command name. */
  static stat(pid: number): { state: string; startTime: number } | undefined {
    try {
      const text = readFileSync(`/proc/${pid}/stat`, "utf8");
      const fields = text
        .slice(text.lastIndexOf(")") + 1)
        .trim()
        .split(/\s+/);
      return { state: fields[0] as string, startTime: Number(fields[19]) };
    } catch {
      return undefined;
    }
  }

  /** A live unrelated process (a `sleep`). */
  async live(): Promise<number> {
    const c = spawn("sleep", ["60"], { stdio: "ignore" });
    this.#children.push(c);
    await until(() => TestProcesses.stat(c.pid as number) !== undefined, "sleep to start");
    return c.pid as number;
  }

  /**
   * A real zombie: `sh` starts `head -n1` in the background on its stdin, prints its pid, then becomes
   * `sleep 60` (exec), which never waits. Only once the exec is seen does `head` end (a line on stdin):
   * before the exec `sh` itself could still reap it.
   */
  async zombie(): Promise<number> {
    const parent = spawn("sh", ["-c", "exec 3<&0; head -n1 <&3 >/dev/null & echo $!; exec sleep 60 3<&-"], {
      stdio: ["pipe", "pipe", "ignore"],
    });
    this.#children.push(parent);
    const pid = await new Promise<number>((resolve, reject) => {
      parent.stdout?.once("data", (b: Buffer) => resolve(Number(b.toString().trim())));
      parent.once("error", reject);
    });
    const comm = () => {
      try {
        return readFileSync(`/proc/${parent.pid}/comm`, "utf8").trim();
      } catch {
        return "";
      }
    };
    await until(() => comm() === "sleep", "sh to become sleep");
    parent.stdin?.end("\n");
    await until(() => TestProcesses.stat(pid)?.state === "Z", `pid ${pid} to become a zombie`);
    return pid;
  }

  /** The pid of a process that ran, exited and was reaped. */
  async gone(): Promise<number> {
    const c = spawn("true", { stdio: "ignore" });
    await new Promise((r) => c.once("exit", r));
    return c.pid as number;
  }

  killAll(): void {
    for (const c of this.#children.splice(0)) c.kill("SIGKILL");
  }
}

/** Whether a process with this pid exists (signal 0 checks without sending anything); no pid is none. */
export function alive(pid: number | undefined): boolean {
  if (!pid) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Polls `check` every 20 ms until it holds; past 10 s it fails naming what it waited for. */
export async function until(check: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
export { type FinishedRun, runToEnd } from "./runToEnd.js";
