import { readFileSync } from "node:fs";

/**
 * Whether a recorded pid is still the process that recorded it.
 * - `alive`: the pid runs, and (when a start time was recorded) it started when the record says.
 * - `zombie`: the process exited but its parent has not reaped it. `kill(pid, 0)` still succeeds on a zombie,
 *   so in a container whose init does not reap, a SIGKILLed daemon would look alive forever without this.
 * - `reused`: the pid runs, but it started at another time: a different process got the same pid.
 * - `gone`: no such process (or the kernel is tearing it down, state `X`).
 */
export type Liveness = "alive" | "zombie" | "reused" | "gone";

/** The two fields of `/proc/<pid>/stat` that identify a process. */
export interface ProcStat {
  /** Field 3: `R`, `S`, `D`, `Z`, `X`, … */
  readonly state: string;
  /** Field 22: when the process started, in clock ticks since boot. Unique per pid at any one time. */
  readonly startTime: number;
}

/**
 * Parses one `/proc/<pid>/stat` line. The command name (field 2) is in parentheses and may itself hold spaces
 * and parentheses, so the fixed fields are read after the last `)`.
 */
export function parseProcStat(text: string): ProcStat | undefined {
  const close = text.lastIndexOf(")");
  if (close < 0) return undefined;
  // After ")": field 3 (state) is token 0, so field N is token N - 3.
  const fields = text
    .slice(close + 1)
    .trim()
    .split(/\s+/);
  const state = fields[0];
  const startTime = Number(fields[22 - 3]);
  if (!state || !Number.isSafeInteger(startTime) || startTime < 0) return undefined;
  return { state, startTime };
}

export interface ProcOptions {
  /** Where procfs is mounted; a directory without it makes every check fall back to `kill(pid, 0)`. */
  readonly procRoot?: string;
}

/** `/proc/<pid>/stat` parsed, or undefined when it cannot be read (no procfs, no such pid, hidden pid). */
export function readProcStat(pid: number | "self", options: ProcOptions = {}): ProcStat | undefined {
  try {
    return parseProcStat(readFileSync(`${options.procRoot ?? "/proc"}/${pid}/stat`, "utf8"));
  } catch {
    return undefined;
  }
}

/** This process's start time (clock ticks since boot), for the lock and state files; undefined without procfs. */
export function ownStartTime(options: ProcOptions = {}): number | undefined {
  return readProcStat("self", options)?.startTime;
}

function signalZeroAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    // EPERM: the pid exists but belongs to another user.
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}

/**
 * How `pid` fares against what was recorded about it. Without a recorded start time (files written by an
 * older crw) only the zombie check applies. When `/proc/<pid>/stat` cannot be read — no procfs (macOS), or a
 * pid procfs hides (`hidepid`) — this falls back to `kill(pid, 0)`, which cannot see zombies or reuse.
 */
export function processLiveness(
  pid: number,
  recordedStartTime?: number,
  options: ProcOptions = {},
): Liveness {
  if (!Number.isSafeInteger(pid) || pid <= 0) return "gone";
  const stat = readProcStat(pid, options);
  if (!stat) return signalZeroAlive(pid) ? "alive" : "gone";
  if (recordedStartTime !== undefined && stat.startTime !== recordedStartTime) return "reused";
  if (stat.state === "Z") return "zombie";
  if (stat.state === "X") return "gone";
  return "alive";
}
