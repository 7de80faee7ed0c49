import type { LightRow } from "./lightJournal.js";
import { heldProcessLocks, lockHolder } from "./locks.js";
import { type OwnerView, readOwnerView } from "./ownerView.js";
import type { RunPaths } from "./paths.js";

/**
 * A run's state as the owner's commands read it (no row written, nothing bound):
 *   ended     the journal has run_ended (with its status)
 *   starting  the start holds its start lock, or the run lock's holder has not recorded its started row
 *             (the newest started row names a process lock that was let go, or names none while a
 *             process lock of the run is held)
 *   paused    no process holds the run and its last word is run_paused
 *   running / waiting_session   a process holds the run (waiting_session: steps wait for the owner)
 *   unheld    no process holds a run that is neither paused nor over: it is to be resumed
 */
export type RunStateKind = "ended" | "starting" | "paused" | "running" | "waiting_session" | "unheld";

export interface RunState {
  kind: RunStateKind;
  /** What the owner's commands read of the journal (folded, not its rows). */
  view: OwnerView;
  /** The started row of the process that holds the run (when it recorded it). */
  holderStarted: LightRow | null;
  endedStatus: string | null;
  pausedReason: string | null;
  holderPid: number | null;
}

export function readRunState(paths: RunPaths, stepsWaiting: boolean): RunState {
  const view = readOwnerView(paths);
  const { ended, started, paused } = view;
  const base = { view, holderStarted: null, endedStatus: null, pausedReason: null, holderPid: null };
  if (ended) return { ...base, kind: "ended", endedStatus: String(ended.status) };
  if (lockHolder(paths.startLock)) return { ...base, kind: "starting" };
  const runHolder = lockHolder(paths.runLock);
  const processLocks = heldProcessLocks(paths.dir);
  if (runHolder) {
    const token = started?.process;
    const recorded =
      started !== null &&
      (typeof token === "string" ? processLocks.has(token) : processLocks.size === 0) &&
      started.pid === runHolder.pid;
    if (!recorded) return { ...base, kind: "starting", holderPid: runHolder.pid };
    return {
      ...base,
      kind: stepsWaiting ? "waiting_session" : "running",
      holderStarted: started,
      holderPid: runHolder.pid,
    };
  }
  if (paused && (!started || paused.seq > started.seq)) {
    return { ...base, kind: "paused", pausedReason: String(paused.reason) };
  }
  return { ...base, kind: "unheld" };
}
