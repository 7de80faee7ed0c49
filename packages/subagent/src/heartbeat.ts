import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { monitorEventLoopDelay } from "node:perf_hooks";

/** How often a runner reports its load. Boot may shorten it (tests); nothing lengthens it silently. */
export const HEARTBEAT_INTERVAL_MS = 5_000;

/** Runner side: event-loop delay p99 since the previous beat, in milliseconds. */
export class EventLoopSampler {
  readonly #histogram = monitorEventLoopDelay({ resolution: 10 });

  constructor() {
    this.#histogram.enable();
  }

  takeP99Ms(): number {
    const p99 = this.#histogram.count > 0 ? this.#histogram.percentile(99) / 1e6 : 0;
    this.#histogram.reset();
    return Math.max(0, Math.round(p99 * 100) / 100);
  }

  stop(): void {
    this.#histogram.disable();
  }
}

export interface TreeMemory {
  /** Resident memory of the runner and every descendant process, in bytes. */
  rssBytes: number;
  processes: number;
  /** False when descendants could not be measured; rssBytes is then the runner's own heartbeat figure. */
  complete: boolean;
}

/**
 * Daemon side: resident memory of a runner's process tree, read from procfs (`/proc/<pid>/task/<tid>/children`
 * and `VmRSS`). Throws when the tree cannot be read; the caller keeps the heartbeat's own RSS instead.
 */
export async function measureProcessTree(
  pid: number,
  procRoot = "/proc",
): Promise<{ rssBytes: number; processes: number }> {
  let rssBytes = 0;
  let processes = 0;
  const seen = new Set<number>();
  const stack = [pid];
  while (stack.length > 0) {
    const current = stack.pop() as number;
    if (seen.has(current)) continue;
    seen.add(current);
    let status: string;
    try {
      status = await readFile(join(procRoot, String(current), "status"), "utf8");
    } catch (e) {
      // A descendant may exit between listing and reading; the root itself must be readable.
      if (current === pid) throw e;
      continue;
    }
    const match = /^VmRSS:\s+(\d+)\s+kB$/m.exec(status);
    rssBytes += match?.[1] ? Number(match[1]) * 1024 : 0;
    processes += 1;
    for (const child of await childrenOf(current, procRoot, current === pid)) stack.push(child);
  }
  return { rssBytes, processes };
}

async function childrenOf(pid: number, procRoot: string, strict: boolean): Promise<number[]> {
  const { readdir } = await import("node:fs/promises");
  const out: number[] = [];
  let tasks: string[];
  try {
    tasks = await readdir(join(procRoot, String(pid), "task"));
  } catch (e) {
    if (strict) throw e;
    return out;
  }
  for (const tid of tasks) {
    try {
      const text = await readFile(join(procRoot, String(pid), "task", tid, "children"), "utf8");
      for (const part of text.split(/\s+/)) if (part) out.push(Number(part));
    } catch (e) {
      if (strict) throw e;
    }
  }
  return out;
}
