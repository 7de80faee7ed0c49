import { spawn } from "node:child_process";

/**
 * Processes a runner started for its turns, tracked so they can be cleaned up when the runner itself dies
 * (SIGKILL runs no hooks in the runner). Each is started in its own process group; its kill token names
 * that group. The runner reports its newest token set with a revision in every heartbeat; the daemon keeps
 * the newest revision and, when the runner exits, hands the tokens to its cleanup sink. Tokens are
 * daemon-private: they never reach /health or any client.
 */
export class ProcessContainment {
  readonly #tokens = new Map<number, string>();
  #revision = 0;

  get revision(): number {
    return this.#revision;
  }

  snapshot(): { revision: number; killTokens: string[] } | undefined {
    return this.#revision === 0
      ? undefined
      : { revision: this.#revision, killTokens: [...this.#tokens.values()] };
  }

  /** An orderly stop takes its processes with it (a SIGKILLed runner leaves that to the daemon's sink). */
  killAll(): void {
    killContainedProcesses([...this.#tokens.values()]);
  }

  /** Start `command` in a new process group; resolves with its pid once it runs. */
  start(command: readonly string[], cwd?: string): Promise<number> {
    const [file, ...args] = command;
    if (!file) return Promise.reject(new Error("empty command"));
    return new Promise((resolve, reject) => {
      const child = spawn(file, args, { detached: true, stdio: "ignore", ...(cwd && { cwd }) });
      child.once("error", reject);
      child.once("spawn", () => {
        const pid = child.pid as number;
        this.#tokens.set(pid, `pgid:${pid}`);
        this.#revision += 1;
        child.once("exit", () => {
          this.#tokens.delete(pid);
          this.#revision += 1;
        });
        child.unref();
        resolve(pid);
      });
    });
  }
}

/** Daemon side: kill every process group named by a dead runner's kill tokens; returns how many were signalled. */
export function killContainedProcesses(killTokens: readonly string[]): number {
  let signalled = 0;
  for (const token of killTokens) {
    const match = /^pgid:(\d+)$/.exec(token);
    const pgid = match?.[1] ? Number(match[1]) : 0;
    if (pgid <= 1) continue;
    try {
      process.kill(-pgid, "SIGKILL");
      signalled += 1;
    } catch {
      // Already gone: nothing left to clean up.
    }
  }
  return signalled;
}
