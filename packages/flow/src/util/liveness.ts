import { existsSync, readFileSync } from "node:fs";

/**
 * Whether `pid` runs, and when `started` is given, is still the process that started then: a pid is handed
 * out again (after a restart, most likely), and a lock left by a killed machine must not be held by
 * whichever process has its pid now. A zombie (a process that exited and that its parent has not reaped
 * yet: a run process SIGKILLed under an init that reaps late) does not run, though `kill(pid, 0)` still
 * succeeds on it: where there is a procfs its state says which.
 */
export function pidAlive(pid: number, started?: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
  } catch (e) {
    // EPERM: another user's process has the pid; its procfs entry says whether it is the holder
    if ((e as NodeJS.ErrnoException).code !== "EPERM") return false;
  }
  if (!procfs) return true;
  const stat = procStat(pid);
  // gone between the two looks, exited, or another process under the same pid
  if (!stat || stat.state === "Z" || stat.state === "X") return false;
  return started === undefined || stat.started === started;
}

const procfs = existsSync("/proc/self/stat");

/** Fields 3 (state) and 22 (start, in clock ticks since boot) of `/proc/<pid>/stat`. */
function procStat(pid: number | "self"): { state: string; started: number } | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // the command name (field 2) may hold spaces and parentheses: the fixed fields follow the last ")"
    const fields = stat
      .slice(stat.lastIndexOf(")") + 1)
      .trim()
      .split(/\s+/);
    return { state: fields[0] ?? "", started: Number(fields[22 - 3]) };
  } catch {
    return undefined;
  }
}

/** This process's start for its lock files; undefined without a procfs. */
export function ownStart(): number | undefined {
  return procfs ? procStat("self")?.started : undefined;
}
